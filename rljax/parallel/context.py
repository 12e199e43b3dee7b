"""Context parallelism: the tokens of every row split over the mesh's ``context`` axis.

**Layout: striped.** With ``N`` devices on the axis, device ``c`` holds slots ``c, c+N, c+2N, ..``
of every row (``rljax.parallel.ring``: why striped, and the ring itself). The sampler's KV cache
is striped the same way (``Context.cache_attend``).

**The learner's forwards** (``forward``) run the model on *folded* rows (``fold``): ``[B, S] ->
[N*B, S/N]``, row ``c*B + b`` holding device c's stripe of row b. Everything but attention is
per token, so the merged row axis is split over ``(context, batch axes)`` like any batch rows:
embeddings, MLPs, norms, the chunked log-probs and the losses' ``(sum, count)`` pairs need
nothing of their own (their sums over the axis are XLA's reductions, exact up to the order of a
float32 sum). Attention enters a ``shard_map`` whose local rows are one device's stripes, and
runs the ring there. Per-token results come back to ``[B, S]`` with ``unfold``.

The model (``rljax.models``) knows none of this: it takes its attention as a strategy
(``layers.Attend``), and this module hands it the ring's; the sampler (``rljax.rollout``) takes
a ``Context`` as data and calls its methods.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from rljax.models import attention as attention_lib
from rljax.models import transformer
from rljax.models.config import ModelConfig
from rljax.parallel import ring

FUSED_BACKENDS = ("cudnn", "pallas")  # model.attention values that cannot run a ring step


def padded_length(s: int, n: int) -> int:
  """``s`` rounded up to a multiple of ``n``."""
  return -(-s // n) * n


def pad_slots(x, n: int, value=0):
  """x [B, S, ...] padded at the end of axis 1 to a multiple of ``n`` slots."""
  extra = padded_length(x.shape[1], n) - x.shape[1]
  if not extra:
    return x
  return jnp.pad(x, ((0, 0), (0, extra)) + ((0, 0),) * (x.ndim - 2), constant_values=value)


def fold(x, n: int):
  """[B, S, ...] -> [N*B, S/N, ...]: row ``c*B + b``, local slot i holds slot ``c + N*i`` of row
  b (``S`` a multiple of ``n``: ``pad_slots``). Context-major, so that the merged axis split
  over ``(context, batch axes)`` gives device c its own stripe of its own rows."""
  b, s = x.shape[:2]
  if s % n:
    raise ValueError(f"{s} slots do not fold over {n} devices (pad_slots first)")
  x = x.reshape((b, s // n, n) + x.shape[2:])
  return jnp.moveaxis(x, 2, 0).reshape((n * b, s // n) + x.shape[3:])


def unfold(y, n: int, length: int | None = None):
  """The inverse of ``fold``: [N*B, S/N, ...] -> [B, S, ...], cut to ``length`` slots."""
  nb, sl = y.shape[:2]
  y = y.reshape((n, nb // n, sl) + y.shape[2:])
  y = jnp.moveaxis(y, 0, 2).reshape((nb // n, sl * n) + y.shape[3:])
  return y if length is None else y[:, :length]


def check_backend(backend: str, n: int) -> None:
  """One line where ``model.attention`` names a fused kernel and the rows are split over
  ``n > 1`` devices: cuDNN's and splash's APIs return no log-sum-exp to combine ring steps (nor
  take one in their backward). 'auto' runs the blockwise kernel on each device then."""
  if n > 1 and backend in FUSED_BACKENDS:
    raise ValueError(f"model.attention={backend!r} cannot run with the sequence split over "
                     f"mesh.context={n} devices (its kernel returns no log-sum-exp to combine "
                     "ring steps): use 'auto' or 'blockwise', the ring's blockwise kernel")


@dataclasses.dataclass(frozen=True)
class Context:
  """Where rows are split: ``size`` = N devices on mesh axis ``axis`` of ``mesh``, rows over
  ``(axis, *row_axes)`` and heads over ``head_axes`` where they divide (``layout``).

  The sampler, inside a ``shard_map`` manual over the axis, uses the methods below the fields
  (``rljax.rollout.sampler`` takes a ``Context`` as data and imports nothing of this module)."""
  size: int
  axis: str = "context"
  mesh: Any = None
  row_axes: tuple = ()
  head_axes: tuple = ()

  def padded(self, s: int) -> int:
    """``s`` slots rounded up to a multiple of N."""
    return padded_length(s, self.size)

  def stripe(self, x):
    """This device's stripe [B, S/N, ...] of x [B, S, ...]."""
    return ring.stripe(x, jax.lax.axis_index(self.axis), self.size)

  def from_last(self, x):
    """The last device's x on every device (it holds slot S-1 of a striped row)."""
    return ring.from_device(x, self.size - 1, self.axis)

  def gather(self, x):
    """The stripes [B, S/N, ...] of every device put together: [B, S, ...]."""
    return ring.gather_stripes(x, self.axis, self.size)

  def cache_attend(self, cfg: ModelConfig, slot, kv_valid, s: int):
    """The attention strategy of a forward through the striped KV cache
    (``ring.cache_attend_at``)."""
    check_backend(cfg.attention, self.size)
    return ring.cache_attend_at(cfg, slot, kv_valid, s, self.axis, self.size)


def layout(mesh, row_axes: tuple, head_axes: tuple) -> Context | None:
  """The ``Context`` of ``mesh``'s ``context`` axis (rows split over ``row_axes``, heads over
  ``head_axes``: the partition rules' ``batch`` and ``act_heads``), None where it has one
  device."""
  size = dict(mesh.shape).get("context", 1)
  if size == 1:
    return None
  return Context(size=size, axis="context", mesh=mesh, row_axes=tuple(row_axes),
                 head_axes=tuple(head_axes))


# --- the learner's forwards: folded rows, the ring in a shard_map --------------------------------

def _dividing_prefix(axes: tuple, sizes: dict, n: int) -> tuple:
  """The longest prefix of ``axes`` (those of more than one device) whose sizes multiply to a
  divisor of ``n``."""
  axes = tuple(a for a in axes if sizes.get(a, 1) > 1)
  while axes and n % math.prod(sizes[a] for a in axes):
    axes = axes[:-1]
  return axes


def folded_spec(context: Context, rows: int) -> P:
  """``PartitionSpec`` of folded rows [N*B, ...] of ``rows`` = B rows: the merged axis over
  ``(axis, *row_axes)`` (the row axes whose sizes divide B)."""
  sizes = dict(context.mesh.shape)
  return P((context.axis,) + _dividing_prefix(context.row_axes, sizes, rows))


def place_folded(x, context: Context, rows: int):
  """x [N*B, ...] constrained to ``folded_spec`` (the forward starts split over the axis)."""
  return jax.lax.with_sharding_constraint(
      x, NamedSharding(context.mesh, folded_spec(context, rows)))


def self_attention(cfg: ModelConfig, context: Context, segments):
  """The attention strategy (``layers.Attend``) of a forward over folded rows: ``segments``
  [B, S] (S a multiple of N) are the unfolded rows' ids; q [N*B, S/N, H, Dh] and k, v arrive
  folded. Each device runs ``ring.ring_attention`` on its stripes (heads split over
  ``head_axes`` where they divide both H and G)."""
  check_backend(cfg.attention, context.size)
  n, b = context.size, segments.shape[0]
  rows = jax.tree.map(lambda x: fold(x, n), ring.global_rows(segments))
  sizes = dict(context.mesh.shape)
  row_spec = folded_spec(context, b)[0]

  def attend(q, k, v, layer_cache, window):
    heads = _dividing_prefix(context.head_axes, sizes, math.gcd(q.shape[2], k.shape[2]))
    head_spec = heads[0] if len(heads) == 1 else (heads or None)
    x_spec, r_spec = P(row_spec, None, head_spec, None), P(row_spec, None)
    local = functools.partial(ring.ring_attention, axis=context.axis, n=n, window=window,
                              block=cfg.attention_block)
    mapped = jax.shard_map(local, mesh=context.mesh,
                           in_specs=(x_spec, x_spec, x_spec, attention_lib.Rows(*(r_spec,) * 4)),
                           out_specs=x_spec, check_vma=False)
    return mapped(q, k.astype(q.dtype), v.astype(q.dtype), rows), layer_cache
  return attend


def forward(cfg: ModelConfig, params: dict, tokens, attn_mask, context: Context,
            head: str = "lm", routes=None):
  """``transformer.forward_with_routes`` with every row split over the N devices of
  ``context``: the rows padded to ``S'``, a multiple of N (padding slots are segment 0),
  positions and segments taken from the whole rows, the model run on ``fold``-ed rows
  [N*B, S'/N] with ring attention. Returns (hidden [N*B, S'/N, D] *folded*: ``unfold(y, N, S)``
  puts per-token results back in [B, S]; the module; ``MoEOut`` with routes [B, S, L_moe, k])."""
  n, (b, s) = context.size, tokens.shape
  model = transformer.bind(cfg, params, head)
  segments = pad_slots(attention_lib.as_segments(attn_mask), n)
  positions = transformer.positions_from_mask(segments)
  folded = lambda x: place_folded(fold(pad_slots(x, n), n), context, b)
  hidden, _, moe = model(folded(tokens), folded(positions),
                         self_attention(cfg, context, segments), valid=folded(segments > 0),
                         routes=None if routes is None else folded(routes))
  if moe is not None:
    moe = moe._replace(routes=unfold(moe.routes, n, s))
  return hidden, model, moe


def per_token(cfg: ModelConfig, params, tokens, segments, context: Context, head: str,
              out, targets=None, routes=None):
  """``(out(model, hidden, targets) at every slot [B, S], moe)`` of ``forward``: ``out`` runs on
  the folded rows (each device its own slots; the log-prob chunks over them) and its per-token
  results come back unfolded. ``targets`` [B, S]: default the next token (slot s predicts token
  s+1; the last slot's target is 0, and nothing reads it)."""
  n, s = context.size, tokens.shape[1]
  hidden, model, moe = forward(cfg, params, tokens, segments, context, head, routes)
  if targets is None:
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
  y = out(model, hidden, fold(pad_slots(targets, n), n))
  return jax.tree.map(lambda a: unfold(a, n, s), y), moe

"""Mixture-of-experts MLP block with Qwen3-MoE semantics, in Flax NNX.

A router scores every token against ``E`` experts; each token goes to its ``k`` best experts and
its output is their gated sum (Shazeer et al. 2017, "Outrageously Large Neural Networks: The
Sparsely-Gated Mixture-of-Experts Layer"):

    p = softmax(x W_r)                            [T, E], in float32
    (g, r) = top_k(p, k)                          gates and expert ids [T, k]
    g = g / sum_j g_j          (if norm_topk_prob)
    y = sum_j g_j * down_{r_j}(silu(gate_{r_j}(x)) * up_{r_j}(x))

Numerically this is ``transformers``' ``Qwen3MoeSparseMoeBlock`` (router logits in the compute
dtype, softmax in float32, gates cast back to the compute dtype). Three ways of running the
experts (``dispatch``) give the same answer when nothing is dropped:

* ``'dense'``: every expert runs on every token and a [T, E] gate matrix that is zero off the
  chosen experts combines them. Exact and dropless, E/k times the expert FLOPs; shards on the
  expert axis with no data movement beyond a reduction.
* ``'sparse'``: dropless grouped matmuls (MegaBlocks, Gale et al. 2023, "MegaBlocks: Efficient
  Sparse Training with Mixture-of-Experts"). The T*k token-choice pairs are sorted by expert,
  each expert's group padded to a multiple of a block of ``b`` rows, and every block multiplied
  by its expert's kernels (``grouped_matmul``): ``(T*k + E*(b-1))/(T*k)`` times the FLOPs of
  the chosen experts at most, ``b`` chosen so that this is <= 1 + ``MAX_BLOCK_PADDING``
  (``block_rows``: large blocks gather fewer kernel copies, small ones pad less). Nothing is
  dropped, so it equals ``'dense'`` up to float summation order.
  ``jax.lax.ragged_dot`` is the same contraction, but XLA:CPU expands it into a masked matmul
  over every group (E times the FLOPs; ``benchmarks/moe_dispatch.py`` measures it).
* ``'capacity'``: GShard / Switch one-hot dispatch into ``C`` slots per expert (Lepikhin et al.
  2021, "GShard"; Fedus et al. 2021, "Switch Transformers"). Token-choice pairs past an expert's
  capacity are dropped and counted.

**Router replay**: ``routes`` (the expert ids the sampler chose) replaces the top-k; the gates are
re-read from the *current* router probabilities at those ids, so the policy update scores exactly
the experts that produced the sample and the router still gets a gradient.

Parameter tree (``nnx.to_pure_dict``) with logical axes, and the Hugging Face checkpoint tensor of
layer ``i`` each leaf is read from (``model.layers.{i}.mlp.`` omitted). HF stores ``[out, in]``,
so every tensor is transposed, and expert ``e``'s go to index ``e`` of the leading E axis.
``transformers`` 5.x fuses gate and up in memory as ``experts.gate_up_proj`` [E, 2F, D] (gate rows
first) and keeps ``experts.down_proj`` [E, D, F]:

=================  =========  ===============================  =================================
leaf               shape      logical axes                     HF tensor
=================  =========  ===============================  =================================
``router/kernel``  [D, E]     ``("embed", None)``              ``gate.weight`` [E, D]
``gate_proj``      [E, D, F]  ``("experts", "embed", "mlp")``  ``experts.{e}.gate_proj.weight``
``up_proj``        [E, D, F]  ``("experts", "embed", "mlp")``  ``experts.{e}.up_proj.weight``
``down_proj``      [E, F, D]  ``("experts", "mlp", "embed")``  ``experts.{e}.down_proj.weight``
=================  =========  ===============================  =================================

With low-rank adapters on a projection (``lora_targets``, ``rljax.models.lora``), e.g.
``gate_proj``, the block also holds ``gate_proj_lora_a`` [E, D, r] (axes ``("experts", "embed",
"lora_rank")``) and ``gate_proj_lora_b`` [E, r, F], and every dispatch computes expert ``e``'s
projection as ``x W_e + (alpha / r) (x A_e) B_e``.

Axis names: B batch, S sequence, T = B*S tokens, D hidden, F expert width
(``moe_intermediate_size``), E experts, k experts per token, C slots per expert.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.config.table import options
from rljax.models import lora

DISPATCHES = options("model.moe_dispatch")  # declared once, in the key table
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # the expert kernels, as named in the tree
# The sparse dispatch's blocks (``block_rows``): the most rows of padding it adds, as a share of
# the T*k token-choice pairs (the FLOPs it may add), the most rows of a block, and what one
# block's kernel gather costs in rows of matmul (XLA:CPU, fitted to the block sizes that
# ``benchmarks/moe_dispatch.py`` timed fastest; see benchmarks/RESULTS.md).
MAX_BLOCK_PADDING = 0.125
MAX_BLOCK_ROWS = 128
BLOCK_GATHER_ROWS = 16


class MoEStats(NamedTuple):
  """What one MoE call reports besides its output (a pytree)."""
  routes: jax.Array  # [B, S, k] int32: chosen expert ids, in top_k order (or the replayed ids)
  aux_loss: jax.Array  # [] float32: load-balancing loss over valid tokens
  dropped: jax.Array  # [] int32: valid token-choice pairs dropped by capacity (0 if dropless)
  capacity: int  # slots per expert (0 for the dropless 'dense' and 'sparse')


def router_probs(logits: jax.Array) -> jax.Array:
  """``softmax(logits)`` [T, E] in float32, whatever the compute dtype (as ``transformers``)."""
  return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def top_k_gates(probs: jax.Array, k: int, norm_topk_prob: bool,
                routes: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Gates [T, k] float32 and expert ids [T, k] int32.

  ``routes=None``: ``(g, r) = top_k(p, k)``. Otherwise (router replay) ``r = routes`` and
  ``g = p[r]``, read from the current probabilities so the router keeps its gradient. Either way
  ``g /= sum_j g_j`` when ``norm_topk_prob`` (Qwen3-MoE; Mixtral's routing is the same).
  """
  if routes is None:
    gates, routes = jax.lax.top_k(probs, k)
  else:
    gates = jnp.take_along_axis(probs, routes, axis=-1)
  if norm_topk_prob:
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
  return gates, routes.astype(jnp.int32)


def load_balancing_loss(probs: jax.Array, routes: jax.Array,
                        valid: jax.Array | None = None) -> jax.Array:
  """Switch Transformer auxiliary loss (Fedus et al. 2021, eq. 4-6), as ``transformers``'
  ``load_balancing_loss_func`` computes it for one layer:

      loss = E * sum_e f_e * P_e,
      f_e = #{(t, j): r_tj = e, t valid} / N,   P_e = sum_{t valid} p_te / N,   N = #valid tokens.

  ``f_e`` counts token-choice pairs, so ``sum_e f_e = k`` (``transformers`` divides by tokens,
  not pairs); it is a count, so the gradient flows through ``P_e`` only. probs [T, E] float,
  routes [T, k] int, valid [T] bool or None (all valid). With no valid token the loss is 0
  (``transformers`` would divide by zero).
  """
  chex.assert_rank([probs, routes], [2, 2])
  chex.assert_equal_shape_prefix([probs, routes], 1)
  num_experts = probs.shape[-1]
  if valid is None:
    valid = jnp.ones(probs.shape[:1], bool)
  chex.assert_shape(valid, probs.shape[:1])
  weight = valid.astype(jnp.float32)
  num_valid = jnp.maximum(jnp.sum(weight), 1.0)
  pairs = jax.nn.one_hot(routes, num_experts, dtype=jnp.float32)  # [T, k, E]
  tokens_per_expert = jnp.einsum("tke,t->e", pairs, weight) / num_valid
  prob_per_expert = jnp.einsum("te,t->e", probs.astype(jnp.float32), weight) / num_valid
  return num_experts * jnp.sum(tokens_per_expert * prob_per_expert)


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float) -> int:
  """Slots per expert ``C = ceil(capacity_factor * T * k / E)`` (GShard; Switch eq. 3 with k)."""
  return int(math.ceil(capacity_factor * num_tokens * k / num_experts))


def dense_combine_weights(routes: jax.Array, gates: jax.Array, num_experts: int) -> jax.Array:
  """[T, E] matrix ``w_te = sum_j g_tj [r_tj = e]``: the gate of each chosen expert, zero
  elsewhere (a repeated id under replay adds its gates)."""
  return jnp.einsum("tke,tk->te", jax.nn.one_hot(routes, num_experts, dtype=gates.dtype), gates)


def capacity_dispatch(routes: jax.Array, gates: jax.Array, valid: jax.Array, num_experts: int,
                      capacity: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """GShard / Switch one-hot dispatch: ``(dispatch [T, E, C], combine [T, E, C], dropped [])``.

  Pairs ``(t, j)`` queue for their expert in choice-major order (every token's first choice, then
  every token's second, ...), so a first choice never loses its slot to a second choice:

      pos_tj = #{(t', j') before (t, j) in that order: r_t'j' = r_tj, t' valid}
      keep_tj = valid_t and pos_tj < C
      dispatch[t, e, c] = sum_j keep_tj [r_tj = e] [pos_tj = c],   combine = dispatch * g_tj.

  Padding tokens (``valid`` False) take no slot and get no output. ``dropped`` counts the valid
  pairs with ``pos >= C``.
  """
  dtype = gates.dtype
  # [k, T, E]: the queue order is the row order of this array flattened.
  wants = jax.nn.one_hot(routes.T, num_experts, dtype=jnp.int32) * valid[None, :, None]
  queue = jnp.cumsum(wants.reshape(-1, num_experts), axis=0).reshape(wants.shape) - 1
  position = jnp.sum(queue * wants, axis=-1)  # [k, T]: slot in the chosen expert
  keep = wants * (position < capacity)[..., None]  # [k, T, E]
  slot = jax.nn.one_hot(position, capacity, dtype=dtype)  # [k, T, C]; 0 where position >= C
  dispatch = jnp.einsum("kte,ktc->tec", keep.astype(dtype), slot)
  combine = jnp.einsum("kte,ktc,tk->tec", keep.astype(dtype), slot, gates)
  dropped = jnp.sum(wants) - jnp.sum(keep)
  return dispatch, combine, dropped.astype(jnp.int32)


def block_rows(num_pairs: int, num_experts: int) -> int:
  """Rows ``b`` of one block of the sparse dispatch, for ``N = T*k`` token-choice pairs.

  At most ``m = min(E, N)`` groups are non-empty and each wastes at most ``b - 1`` rows, so the
  buffer holds ``R = N + m (b - 1)`` rows in ``R / b`` blocks. A block costs its rows' matmuls
  plus one gather of its expert's kernels (and, backward, a scatter-add of their gradient),
  about ``BLOCK_GATHER_ROWS`` rows' worth; ``R (1 + gamma / b)`` is least at
  ``b* = sqrt(gamma (N - m) / m)``. ``b`` is ``b*`` capped so that the padding stays within
  ``MAX_BLOCK_PADDING * N`` (the FLOPs) and ``MAX_BLOCK_ROWS``, and at least 1 (no padding).
  """
  groups = max(1, min(num_experts, num_pairs))
  best = math.sqrt(BLOCK_GATHER_ROWS * max(num_pairs - groups, 0) / groups)
  padding_cap = 1 + MAX_BLOCK_PADDING * num_pairs / groups
  return int(max(1, min(MAX_BLOCK_ROWS, math.floor(best), math.floor(padding_cap))))


def num_blocks(num_pairs: int, num_experts: int, block: int) -> int:
  """Static bound on the blocks of the sparse dispatch:
  ``sum_e ceil(n_e / b) <= (N + m (b - 1)) / b`` with ``m = min(E, N)`` non-empty groups."""
  return (num_pairs + min(num_experts, num_pairs) * (block - 1)) // block


class BlockLayout(NamedTuple):
  """Where the sparse dispatch puts each token-choice pair (a pytree of int32 arrays).

  The pairs ``(t, j)`` (flattened t-major, ``i = t*k + j``) sorted by expert (stably: by ``i``
  within an expert), each expert's group starting on a block boundary of a buffer of
  ``M = NB * b`` rows."""
  slot: jax.Array  # [T*k]: the buffer row of pair i
  source: jax.Array  # [M]: the token each buffer row holds, T for a padding row
  block_expert: jax.Array  # [NB]: the expert of each block (E - 1 for unused trailing blocks)


def sparse_layout(routes: jax.Array, num_experts: int, block: int) -> BlockLayout:
  """The ``BlockLayout`` of routes [T, k] with ``block`` rows per block:

      n_e = #{i: r_i = e},  start_e = sum_{e' < e} ceil(n_e' / b) b
      slot_i = start_{r_i} + #{i' < i: r_i' = r_i}
      block_expert_n = #{e: start_e + ceil(n_e / b) b <= n b}   (the group block n lies in)
  """
  chex.assert_rank(routes, 2)
  num_tokens, k = routes.shape
  n = num_tokens * k
  experts = routes.reshape(n).astype(jnp.int32)
  order = jnp.argsort(experts, stable=True)
  counts = jnp.bincount(experts, length=num_experts)
  padded = (counts + block - 1) // block * block
  padded_end = jnp.cumsum(padded)
  sorted_experts = experts[order]
  # Rank of a pair within its expert: its sorted position minus the group's first position.
  rank = jnp.arange(n) - (jnp.cumsum(counts) - counts)[sorted_experts]
  slot = jnp.zeros(n, jnp.int32).at[order].set(
      ((padded_end - padded)[sorted_experts] + rank).astype(jnp.int32))
  blocks = num_blocks(n, num_experts, block)
  source = jnp.full(blocks * block, num_tokens, jnp.int32).at[slot].set(
      jnp.arange(n, dtype=jnp.int32) // k)
  block_expert = jnp.searchsorted(padded_end, jnp.arange(blocks) * block, side="right")
  return BlockLayout(slot, source, jnp.minimum(block_expert, num_experts - 1).astype(jnp.int32))


def grouped_matmul(rows: jax.Array, kernels: jax.Array, block_expert: jax.Array) -> jax.Array:
  """rows [NB*b, I], kernels [E, I, O], block_expert [NB] -> [NB*b, O]: block n of ``b`` rows
  times ``kernels[block_expert[n]]`` (one batched matmul over the blocks)."""
  blocks = block_expert.shape[0]
  x = rows.reshape(blocks, -1, rows.shape[-1])
  out = jnp.einsum("nbi,nio->nbo", x, kernels[block_expert])
  return out.reshape(rows.shape[0], kernels.shape[-1])


def sparse_experts(x: jax.Array, routes: jax.Array, gates: jax.Array, gate: jax.Array,
                   up: jax.Array, down: jax.Array) -> jax.Array:
  """Dropless sparse dispatch: x [T, D], routes/gates [T, k], kernels [E, D, F], [E, D, F],
  [E, F, D] -> ``y_t = sum_j g_tj down_{r_tj}(silu(gate_{r_tj}(x_t)) * up_{r_tj}(x_t))`` [T, D].

  The pairs' rows are gathered into the ``sparse_layout`` buffer (padding rows read a zero
  row), the three projections run as ``grouped_matmul`` s, and each token gathers its k rows back
  and sums them with its gates: no [T, E, .] tensor is formed.
  """
  num_tokens, k = routes.shape
  num_experts = gate.shape[0]
  layout = sparse_layout(routes, num_experts, block_rows(num_tokens * k, num_experts))
  padded_x = jnp.concatenate([x, jnp.zeros((1, x.shape[-1]), x.dtype)])
  rows = padded_x[layout.source]  # [M, D]
  hidden = (jax.nn.silu(grouped_matmul(rows, gate, layout.block_expert))
            * grouped_matmul(rows, up, layout.block_expert))
  out = grouped_matmul(hidden, down, layout.block_expert)  # [M, D]
  return jnp.einsum("tkd,tk->td", out[layout.slot].reshape(num_tokens, k, -1), gates)


def check_routes(routes, shape: tuple, num_experts: int) -> None:
  """Raise ``ValueError`` unless ``routes`` has ``shape`` [B, S, k] and an integer dtype, and,
  when its values are on the host (NumPy or a concrete ``jax.Array``), every id is in [0, E).

  Traced ids cannot be checked without a device sync or a poisoned output; they are the
  caller's responsibility (the sampler records them from this block's own ``MoEStats.routes``).
  """
  if not isinstance(routes, jax.Array):
    routes = np.asarray(routes)
  if tuple(np.shape(routes)) != tuple(shape):
    raise ValueError(f"routes must have shape [B, S, k] = {tuple(shape)}, got "
                     f"{tuple(np.shape(routes))}")
  if not jnp.issubdtype(routes.dtype, jnp.integer):
    raise ValueError(f"routes must hold integer expert ids, got dtype {routes.dtype}")
  if isinstance(routes, jax.core.Tracer):
    return
  ids = np.asarray(routes)
  bad = (ids < 0) | (ids >= num_experts)
  if bad.any():
    raise ValueError(f"routes hold expert ids outside [0, {num_experts}), e.g. "
                     f"{ids[bad][:5].tolist()} at {np.argwhere(bad)[:5].tolist()}")


class Router(nnx.Module):
  """``logits = x W_r`` [T, E], ``W_r`` [D, E] stored like ``Linear`` (no bias in Qwen3-MoE)."""

  def __init__(self, d_in, num_experts, *, param_dtype, dtype, rngs: nnx.Rngs, std=0.02):
    self.kernel = nnx.Param(
        std * jax.random.normal(rngs.params(), (d_in, num_experts), jnp.dtype(param_dtype)),
        logical_axes=("embed", None))
    self.dtype = jnp.dtype(dtype)

  def __call__(self, x):
    return jnp.dot(x.astype(self.dtype), self.kernel[...].astype(self.dtype))


class MoE(nnx.Module):
  """Sparse MoE MLP (module docstring: formula, parameter tree, dispatch modes, replay).

  ``experts_per_token`` is ``num_experts_per_tok`` (k) and ``norm_topk_prob`` renormalises the k
  gates to sum to one, both as in ``Qwen3MoeConfig``. ``capacity_factor`` is read only by
  ``dispatch='capacity'``.
  """

  def __init__(self, *, hidden_size, moe_intermediate_size, num_experts, experts_per_token,
               norm_topk_prob, param_dtype, dtype, rngs: nnx.Rngs, dispatch="dense",
               capacity_factor=1.25, lora_rank=0, lora_alpha=1.0, lora_targets=()):
    if dispatch not in DISPATCHES:
      raise ValueError(f"dispatch={dispatch!r}; allowed: {DISPATCHES}")
    if not 1 <= experts_per_token <= num_experts:
      raise ValueError(f"experts_per_token={experts_per_token} must be in [1, num_experts="
                       f"{num_experts}]")
    if dispatch == "capacity" and not capacity_factor > 0:
      raise ValueError(f"capacity_factor={capacity_factor} must be > 0")
    d, f, e = hidden_size, moe_intermediate_size, num_experts
    pdt = jnp.dtype(param_dtype)

    def kernel(shape, axes, std=0.02):
      return nnx.Param(std * jax.random.normal(rngs.params(), shape, pdt), logical_axes=axes)

    self.router = Router(d, e, param_dtype=param_dtype, dtype=dtype, rngs=rngs)
    self.gate_proj = kernel((e, d, f), ("experts", "embed", "mlp"))
    self.up_proj = kernel((e, d, f), ("experts", "embed", "mlp"))
    self.down_proj = kernel((e, f, d), ("experts", "mlp", "embed"))
    # Low-rank adapters of the targeted expert kernels: A [E, in, r] (U(-1/sqrt(in), ..)), B = 0.
    self.adapted = tuple(n for n in PROJECTIONS if lora_rank and n in lora_targets)
    for name in self.adapted:
      (_, d_in, d_out), axes = getattr(self, name).shape, getattr(self, name).logical_axes
      setattr(self, f"{name}_{lora.A}", nnx.Param(
          lora.init_a(getattr(rngs, lora.STREAM)(), (e, d_in, lora_rank), pdt),
          logical_axes=(axes[0], axes[1], lora.RANK_AXIS)))
      setattr(self, f"{name}_{lora.B}", nnx.Param(
          jnp.zeros((e, lora_rank, d_out), pdt), logical_axes=(axes[0], lora.RANK_AXIS, axes[2])))
    self.lora_scale = lora_alpha / lora_rank if lora_rank else None
    self.num_experts = e
    self.experts_per_token = experts_per_token
    self.norm_topk_prob = norm_topk_prob
    self.dispatch = dispatch
    self.capacity_factor = capacity_factor
    self.dtype = jnp.dtype(dtype)

  def _kernels(self):
    return tuple(w[...].astype(self.dtype) for w in (self.gate_proj, self.up_proj, self.down_proj))

  def _project(self, name, x, matmul):
    """Expert projection ``name`` of ``x``: ``matmul(x, W)``, plus ``scale * matmul(matmul(x,
    A), B)`` when it has adapters. ``matmul(x, kernels [E, I, O])`` is the dispatch's contraction
    (an einsum over an expert axis, or ``grouped_matmul``)."""
    cast = lambda w: w[...].astype(self.dtype)
    y = matmul(x, cast(getattr(self, name)))
    if name in self.adapted:
      low = matmul(x, cast(getattr(self, f"{name}_{lora.A}")))
      y = y + jnp.asarray(self.lora_scale, self.dtype) * matmul(
          low, cast(getattr(self, f"{name}_{lora.B}")))
    return y

  def _dense(self, x, weights):
    """x [T, D], weights [T, E] -> [T, D]: every expert on every token, then the gated sum."""
    # [T, D] x [E, D, F] -> [T, E, F]; an adapter's [T, E, r] x [E, r, F] -> [T, E, F].
    fan_out = lambda x, w: jnp.einsum("td,edf->tef" if x.ndim == 2 else "ter,erf->tef", x, w)
    hidden = (jax.nn.silu(self._project("gate_proj", x, fan_out))
              * self._project("up_proj", x, fan_out))
    # Gating the [T, E, F] hidden before down_proj sums over experts inside one contraction,
    # never materialising the [T, E, D] per-expert outputs; an adapter's A keeps the expert axis
    # ([T, E, F] x [E, F, r] -> [T, E, r]) and its B sums over it.
    gated = hidden * weights[..., None]
    cast = lambda w: w[...].astype(self.dtype)
    y = jnp.einsum("tef,efd->td", gated, cast(self.down_proj))
    if "down_proj" in self.adapted:
      low = jnp.einsum("tef,efr->ter", gated, cast(self.down_proj_lora_a))
      y = y + jnp.asarray(self.lora_scale, self.dtype) * jnp.einsum(
          "ter,erd->td", low, cast(self.down_proj_lora_b))
    return y

  def _capacity(self, x, dispatch, combine):
    """x [T, D], dispatch/combine [T, E, C] -> [T, D]: gather into slots, run, scatter back."""
    slots = jnp.einsum("tec,td->ecd", dispatch, x)
    per_expert = lambda x, w: jnp.einsum("eci,eio->eco", x, w)
    hidden = (jax.nn.silu(self._project("gate_proj", slots, per_expert))
              * self._project("up_proj", slots, per_expert))
    return jnp.einsum("tec,ecd->td", combine, self._project("down_proj", hidden, per_expert))

  def _sparse(self, x, routes, gates):
    """Dropless sparse dispatch (``sparse_experts``) through ``_project``."""
    if not self.adapted:
      return sparse_experts(x, routes, gates, *self._kernels())
    num_tokens, k = routes.shape
    layout = sparse_layout(routes, self.num_experts, block_rows(num_tokens * k, self.num_experts))
    grouped = lambda rows, w: grouped_matmul(rows, w, layout.block_expert)
    rows = jnp.concatenate([x, jnp.zeros((1, x.shape[-1]), x.dtype)])[layout.source]
    hidden = (jax.nn.silu(self._project("gate_proj", rows, grouped))
              * self._project("up_proj", rows, grouped))
    out = self._project("down_proj", hidden, grouped)
    return jnp.einsum("tkd,tk->td", out[layout.slot].reshape(num_tokens, k, -1), gates)

  def __call__(self, x, valid=None, routes=None) -> tuple[jax.Array, MoEStats]:
    """x [B, S, D]; valid [B, S] bool or None (all valid); routes [B, S, k] int or None.

    Returns ``(y [B, S, D] in the compute dtype, MoEStats)``. ``valid`` masks padding out of the
    load-balancing loss and, under ``'capacity'``, out of the expert queues (padding then outputs
    zero; under ``'dense'`` and ``'sparse'`` it is computed like any token). Under replay the
    loss counts the replayed routes, the ones the output used. Concrete ``routes`` are
    range-checked on the host (a device-to-host copy); traced ones are not (``check_routes``).
    """
    chex.assert_rank(x, 3)
    b, s, d = x.shape
    k, num_experts = self.experts_per_token, self.num_experts
    if valid is None:
      valid = jnp.ones((b, s), bool)
    chex.assert_shape(valid, (b, s))
    if routes is not None:
      check_routes(routes, (b, s, k), num_experts)
      routes = jnp.reshape(routes, (b * s, k))
    tokens = x.astype(self.dtype).reshape(b * s, d)
    flat_valid = valid.reshape(b * s)

    probs = router_probs(self.router(tokens))
    gates, routes = top_k_gates(probs, k, self.norm_topk_prob, routes)
    gates = gates.astype(self.dtype)
    aux_loss = load_balancing_loss(probs, routes, flat_valid)

    if self.dispatch == "dense":
      y = self._dense(tokens, dense_combine_weights(routes, gates, num_experts))
      dropped, capacity = jnp.zeros((), jnp.int32), 0
    elif self.dispatch == "sparse":
      y = self._sparse(tokens, routes, gates)
      dropped, capacity = jnp.zeros((), jnp.int32), 0
    else:
      capacity = expert_capacity(b * s, num_experts, k, self.capacity_factor)
      dispatch, combine, dropped = capacity_dispatch(routes, gates, flat_valid, num_experts,
                                                     capacity)
      y = self._capacity(tokens, dispatch, combine)
    stats = MoEStats(routes=routes.reshape(b, s, k), aux_loss=aux_loss, dropped=dropped,
                     capacity=capacity)
    return y.reshape(b, s, d), stats

"""Low-rank adapters (LoRA; Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A targeted projection ``y = x W (+ b)`` with ``W`` [in, out] gains two trainable factors
``A`` [in, r] and ``B`` [r, out] and computes

    y = x W (+ b) + (alpha / r) (x A) B

with ``W`` frozen. ``A`` is initialised as PEFT does (``kaiming_uniform_(a=sqrt(5))`` on its
[r, in] weight: ``U(-1/sqrt(in), 1/sqrt(in))``) and ``B = 0``, so the adapted model starts as its
base. Mixture-of-experts kernels [E, in, out] get one pair per expert, [E, in, r] and [E, r, out].

Parameter tree: a targeted ``Linear`` holds ``lora_a`` and ``lora_b`` beside its ``kernel``; an
MoE block holds ``gate_proj_lora_a``, ``gate_proj_lora_b``, ... beside ``gate_proj``. ``A`` shares
its kernel's input logical axis and ``B`` its output axis; the rank axis is replicated
(``lora_rank``). Targets are PEFT's ``target_modules`` names (``TARGETS``); a name matches the
dense MLP's projection and the experts' alike, as PEFT's suffix match does on the Hugging Face
Qwen3-MoE layout.

Everything that is not an adapter (embeddings, norms, every kernel, the head) is the frozen
*base*: ``split_adapters`` separates the two trees, ``join_adapters`` puts them back together and
``merge_adapters`` folds the adapters into the kernels (the base layout: what the sampler, the
Hugging Face export and a rank-0 model read).
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

# PEFT's target_modules names of the projections that can carry adapters (attention, then MLP /
# experts); 'all' targets every one of them.
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION_TARGETS + MLP_TARGETS
ALL = "all"
# Leaf names of the factors: ``lora_a`` / ``lora_b`` inside a Linear, ``<kernel>_lora_a`` /
# ``<kernel>_lora_b`` beside an expert kernel.
A, B = "lora_a", "lora_b"
RANK_AXIS = "lora_rank"  # logical axis of the rank dimension (replicated by the partition rules)
# The random stream of the adapters' initialisation (``nnx.Rngs(seed, lora=...)``): apart from the
# base's, so a base model initialised with adapters has the weights it has without them.
STREAM = "lora"
# The parameter entry of a vision-language model's image tower (``rljax.vision``): adapters go on
# the language model only, the tower is part of the frozen base.
TOWER = "visual"


def resolve_targets(targets) -> tuple:
  """``model.lora.targets`` -> the sorted tuple of projection names: 'all' (alone or in a tuple)
  is every name of ``TARGETS``; an unknown name is a ``ValueError`` naming it and the choices."""
  names = (targets,) if isinstance(targets, str) else tuple(targets)
  unknown = [n for n in names if n not in TARGETS and n != ALL]
  if unknown:
    raise ValueError(f"model.lora.targets names {unknown}, which are no projection; choose from "
                     f"{list(TARGETS)} or {ALL!r}")
  if not names:
    raise ValueError(f"model.lora.targets is empty; name projections of {list(TARGETS)} or "
                     f"{ALL!r}")
  return TARGETS if ALL in names else tuple(n for n in TARGETS if n in names)


def lora_scale(cfg) -> float:
  """``alpha / r``, the factor of the adapters' product (PEFT's ``scaling``)."""
  return cfg.lora_alpha / cfg.lora_rank


def init_a(key, shape, dtype) -> jax.Array:
  """``A`` [..., in, r] ~ ``U(-1/sqrt(in), 1/sqrt(in))``: PEFT's ``kaiming_uniform_(a=sqrt(5))``
  of its [r, in] weight (gain ``sqrt(2 / (1 + 5))`` times ``sqrt(3 / fan_in)``)."""
  bound = 1.0 / math.sqrt(shape[-2])
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)


def is_adapter(name: str) -> bool:
  """Whether a leaf named ``name`` is an adapter factor."""
  return name in (A, B) or name.endswith("_" + A) or name.endswith("_" + B)


def split_adapters(params: dict) -> tuple[dict, dict]:
  """``(base, adapters)``: the same nested dict without its adapter leaves, and a nested dict of
  only those (same nesting; subtrees without adapters are left out)."""
  base, adapters = {}, {}
  for name, value in params.items():
    if isinstance(value, dict):
      sub_base, sub_adapters = split_adapters(value)
      base[name] = sub_base
      if sub_adapters:
        adapters[name] = sub_adapters
    elif is_adapter(name):
      adapters[name] = value
    else:
      base[name] = value
  return base, adapters


def join_adapters(base: dict, adapters: dict) -> dict:
  """The inverse of ``split_adapters``: ``base`` with ``adapters`` put back in their places."""
  joined = dict(base)
  for name, value in adapters.items():
    joined[name] = join_adapters(base.get(name, {}), value) if isinstance(value, dict) else value
  return joined


def has_adapters(params: dict) -> bool:
  return bool(split_adapters(params)[1])


def merged_kernel(kernel, a, b, scale: float):
  """``W + scale * A @ B`` in ``W``'s dtype, one fused op: W [..., in, out], A [..., in, r],
  B [..., r, out] (a leading expert axis batches the product)."""
  delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))
  return (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)


def merge_adapters(params: dict, cfg) -> dict:
  """``params`` with every adapter folded into its kernel and dropped: the base layout, whose
  rank-0 forward equals the adapted forward (up to float rounding)."""
  scale = lora_scale(cfg) if cfg.lora_rank else 0.0
  merged = {}
  for name, value in params.items():
    if is_adapter(name):
      continue
    if isinstance(value, dict):
      merged[name] = merge_adapters(value, cfg)
    elif name == "kernel" and A in params:
      merged[name] = merged_kernel(value, params[A], params[B], scale)
    elif f"{name}_{A}" in params:
      merged[name] = merged_kernel(value, params[f"{name}_{A}"], params[f"{name}_{B}"], scale)
    else:
      merged[name] = value
  return merged


def merged_leaves(cfg, tree: dict) -> dict:
  """The leaves of a parameter-shaped ``tree`` (arrays, shapes, shardings) that
  ``merge_adapters`` writes anew: the kernels that have adapters (empty without adapters)."""
  out = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      sub = merged_leaves(cfg, value)
      if sub:
        out[name] = sub
    elif (name == "kernel" and A in tree) or f"{name}_{A}" in tree:
      out[name] = value
  return out


def _targeted(path: tuple, targets: tuple) -> str | None:
  """Where the kernel at ``path`` (its leaf name last) takes adapters: 'linear' (a ``Linear``'s
  ``kernel`` inside a targeted projection), 'experts' (an MoE block's expert kernel named as a
  target), else None; never in an image tower (``TOWER``), whose blocks reuse the names."""
  if path[0] == TOWER:
    return None
  if path[-1] == "kernel" and len(path) >= 2 and path[-2] in targets:
    return "linear"
  if path[-1] in targets and len(path) >= 2 and path[-2] == "mlp":
    return "experts"
  return None


def adapter_shapes(cfg, shapes: dict) -> dict:
  """``{path: (A shape, B shape)}``-like nested dict of the adapters ``cfg`` attaches to the base
  tree ``shapes`` (any leaves with ``.shape``): ``{..., 'lora_a': (in, r), 'lora_b': (r, out)}``
  and ``{..., 'gate_proj_lora_a': (E, in, r), ...}``."""
  targets, r = cfg.lora_targets, cfg.lora_rank

  def visit(tree, path):
    out = {}
    for name, value in tree.items():
      here = path + (name,)
      if isinstance(value, dict):
        sub = visit(value, here)
        if sub:
          out[name] = sub
        continue
      kind = _targeted(here, targets)
      if kind is None:
        continue
      *lead, d_in, d_out = value.shape
      prefix = "" if kind == "linear" else name + "_"
      out[prefix + A] = tuple(lead) + (d_in, r)
      out[prefix + B] = tuple(lead) + (r, d_out)
    return out
  return visit(shapes, ()) if r else {}


def init_adapters(cfg, base: dict, seed: int) -> dict:
  """Fresh adapters for the base tree ``base`` (its kernels' shapes): ``A`` by ``init_a``, one key
  per factor folded from ``seed`` in tree order, ``B = 0``; in ``cfg.param_dtype``."""
  shapes = adapter_shapes(cfg, base)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(
      shapes, is_leaf=lambda x: isinstance(x, tuple))
  key = jax.random.fold_in(jax.random.PRNGKey(seed), 0x10AA)
  dtype = jnp.dtype(cfg.param_dtype)
  values = []
  for i, (path, shape) in enumerate(leaves):
    if path[-1].key.endswith(A):
      values.append(init_a(jax.random.fold_in(key, i), shape, dtype))
    else:
      values.append(jnp.zeros(shape, dtype))
  return jax.tree_util.tree_unflatten(treedef, values)


def cast_base(cfg, params: dict) -> dict:
  """``params`` with the base (every non-adapter leaf) in ``cfg.lora_base_dtype`` when it is set
  and there are adapters (the frozen base kept in the compute dtype); adapters untouched."""
  if not cfg.lora_rank or cfg.lora_base_dtype is None:
    return params
  dtype = jnp.dtype(cfg.lora_base_dtype)
  base, adapters = split_adapters(params)
  cast = lambda x: (x.astype(dtype) if hasattr(x, "astype") else
                    jax.ShapeDtypeStruct(x.shape, dtype, sharding=getattr(x, "sharding", None)))
  return join_adapters(jax.tree.map(cast, base), adapters)


def with_adapters(cfg, base: dict, seed: int) -> dict:
  """A base-layout tree (``merge_adapters``' or a rank-0 model's) with fresh adapters
  (``init_adapters``) and the base in its frozen dtype; ``base`` itself when ``cfg.lora_rank``
  is 0."""
  if not cfg.lora_rank:
    return base
  return cast_base(cfg, join_adapters(base, init_adapters(cfg, base, seed)))


def check_adapters(cfg, adapters: dict, base: dict, what: str) -> None:
  """Raise ``ValueError`` (one line naming ``what``) unless ``adapters`` are exactly the factors
  ``cfg`` attaches to ``base``: the same leaves, each of the shape its kernel implies (adapters
  trained on another base, another rank or other targets are refused)."""
  want = dict(_flat(adapter_shapes(cfg, base)))
  have = {k: tuple(v.shape) for k, v in _flat(adapters)}
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
  if missing or extra or wrong:
    parts = []
    if wrong:
      parts.append(f"{wrong[0]} is {have[wrong[0]]}, the base needs {want[wrong[0]]}")
    if missing:
      parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if extra:
      parts.append(f"{len(extra)} not targeted by this base and config (e.g. {extra[0]})")
    raise ValueError(f"{what}: adapters of another base or config (rank {cfg.lora_rank}, "
                     f"targets {list(cfg.lora_targets)}): {'; '.join(parts)}")


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
  out = []
  for name, value in tree.items():
    key = f"{prefix}/{name}" if prefix else name
    out.extend(_flat(value, key) if isinstance(value, dict) else [(key, value)])
  return out


def count(tree: dict) -> int:
  """Number of scalars in a tree of arrays (or of shape tuples)."""
  sizes = [math.prod(v) if isinstance(v, tuple) else math.prod(v.shape)
           for _, v in _flat(tree)]
  return int(sum(sizes))

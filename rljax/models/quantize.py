"""Per-channel weight quantisation of the transformer's matmul kernels (FP8 rollouts).

Each output channel ``c`` of a kernel ``W`` [..., I, O] (per expert for the stacked [E, I, O]
expert kernels) gets its own scale, the absmax of the channel over the input dimension mapped to
the format's largest finite value (``q_max`` = 448 for ``float8_e4m3fn``):

    s_c = max_i |W_ic| / q_max,      Q_ic = round(W_ic / s_c)   (round to nearest even, in fp8)
    W_ic ~= Q_ic s_c                 (relative error <= 2^-4 for normal fp8 values: 3 mantissa bits)

A channel of zeros gets ``s = 1`` (Q = 0). This is the weight scheme of vLLM's and
TransformerEngine's per-channel FP8 (Micikevicius et al. 2022, "FP8 Formats for Deep Learning").

Applied when the learner's weights are published to the rollout engine with
``rollout.weight_dtype`` set (``rljax.rollout.engines.WeightSync``; docs/rollout.md).

Which weights: the attention and MLP projections of every layer and the experts (``quantized``);
not the embeddings, the LM head, the MoE router (its top-k decides the experts, so vLLM keeps it in
full precision too), norms or biases.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rljax.config.table import options

WEIGHT_DTYPES = options("rollout.weight_dtype")
EXPERT_KERNELS = ("gate_proj", "up_proj", "down_proj")


def quantize_per_channel(w: jax.Array, dtype: str = "float8_e4m3fn"
                         ) -> tuple[jax.Array, jax.Array]:
  """``(Q, s)``: w [..., I, O] -> Q [..., I, O] in ``dtype``, s [..., 1, O] float32 (module
  docstring's formula), with ``w ~= Q * s``."""
  if dtype not in WEIGHT_DTYPES:
    raise ValueError(f"weight dtype {dtype!r}: expected one of {WEIGHT_DTYPES}")
  if w.ndim < 2:
    raise ValueError(f"a kernel [..., in, out] has rank >= 2, got shape {w.shape}")
  w = w.astype(jnp.float32)
  q_max = float(jnp.finfo(jnp.dtype(dtype)).max)
  absmax = jnp.max(jnp.abs(w), axis=-2, keepdims=True)
  scale = jnp.where(absmax > 0, absmax / q_max, 1.0)
  return (w / scale).astype(jnp.dtype(dtype)), scale


def dequantize(q: jax.Array, scale: jax.Array, dtype) -> jax.Array:
  """``Q * s`` in ``dtype`` (the compute dtype the sampler multiplies in)."""
  return (q.astype(jnp.float32) * scale).astype(jnp.dtype(dtype))


def quantized(path: tuple, leaf) -> bool:
  """Whether the parameter at ``path`` (keys of the ``transformer`` parameter tree) is a
  projection kernel of a layer: ``layers_i/.../kernel`` except the router's, or a stacked expert
  kernel ``layers_i/mlp/{gate,up,down}_proj`` [E, I, O]."""
  keys = tuple(getattr(k, "key", k) for k in path)
  if not keys or not str(keys[0]).startswith("layers_"):
    return False
  if keys[-1] == "kernel":
    return "router" not in keys
  return keys[-1] in EXPERT_KERNELS and getattr(leaf, "ndim", 0) == 3


def round_trip_weights(params: dict, dtype: str = "float8_e4m3fn") -> dict:
  """``params`` with every ``quantized`` kernel replaced by ``dequantize(*quantize_per_channel(W,
  dtype), W.dtype)``: the weights a sampler holding ``dtype`` kernels computes with, in the
  parameters' own dtype (what an XLA matmul without FP8 inputs consumes)."""
  def leaf(path, w):
    return dequantize(*quantize_per_channel(w, dtype), w.dtype) if quantized(path, w) else w
  return jax.tree_util.tree_map_with_path(leaf, params)

"""The building blocks that the families share: projections, RMSNorm, RoPE, gated MLP, attention.

A family (``rljax.models.families``) composes them into its decoder block; the generic network
(``rljax.models.transformer``) stacks the blocks. Every block takes an ``attend`` strategy, so one
definition serves the training forward (self-attention over the sequence), the sampler's prefill
and decode (a KV cache) and continuous batching (a blocked cache): the strategy gets the block's
queries, keys and values and returns the attention output (and its cache).

Axis names: B batch, S query length, K key length, D hidden, H query heads, G key/value heads,
Dh head dim, F MLP width.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import lora
from rljax.models.config import ModelConfig

# attend(q [B, Sq, H, Dh], k, v [B, S, G, Dh], layer_cache, window) -> (out [B, Sq, H, Dh],
# layer_cache). The queries are the *last* Sq of the S new positions (Sq < S: only the last
# position's output is needed, e.g. the last layer of a prefill).
Attend = Callable


def _dtype(name: str):
  return jnp.dtype(name)


class Linear(nnx.Module):
  """``y = x W (+ b)`` with ``W`` stored ``[in, out]`` and logical axis names.

  ``target``: the projection's name (``q_proj``, ``down_proj``, ...); when ``cfg`` puts low-rank
  adapters on it (``cfg.lora_rank > 0`` and the name in ``cfg.lora_targets``) the layer also holds
  ``lora_a`` [in, r] and ``lora_b`` [r, out] (``rljax.models.lora``) and computes
  ``y = x W (+ b) + (alpha / r) (x A) B``."""

  def __init__(self, d_in, d_out, *, axes, bias, cfg: ModelConfig, rngs: nnx.Rngs, std=0.02,
               target: str | None = None):
    pdt = _dtype(cfg.param_dtype)
    self.kernel = nnx.Param(std * jax.random.normal(rngs.params(), (d_in, d_out), pdt),
                            logical_axes=axes)
    self.bias = nnx.Param(jnp.zeros((d_out,), pdt), logical_axes=axes[1:]) if bias else None
    self.dtype = _dtype(cfg.dtype)
    self.lora_scale = None
    if cfg.lora_rank and target in cfg.lora_targets:
      r = cfg.lora_rank
      self.lora_a = nnx.Param(lora.init_a(getattr(rngs, lora.STREAM)(), (d_in, r), pdt),
                              logical_axes=(axes[0], lora.RANK_AXIS))
      self.lora_b = nnx.Param(jnp.zeros((r, d_out), pdt), logical_axes=(lora.RANK_AXIS, axes[1]))
      self.lora_scale = lora.lora_scale(cfg)

  def __call__(self, x):
    # Flattened to a 2-D GEMM: XLA:CPU runs the weight gradient of a dot contracting two leading
    # axes ([B, S, in] x [B, S, out]) several times slower than the same [B*S] contraction.
    kernel = self.kernel[...].astype(self.dtype)
    rows = x.astype(self.dtype).reshape(-1, x.shape[-1])
    y = jnp.dot(rows, kernel)
    if self.lora_scale is not None:
      # (x A) B, never A B: [in, r] and [r, out] GEMMs instead of an [in, out] product.
      low = jnp.dot(rows, self.lora_a[...].astype(self.dtype))
      y = y + jnp.asarray(self.lora_scale, self.dtype) * jnp.dot(
          low, self.lora_b[...].astype(self.dtype))
    y = y.reshape(x.shape[:-1] + (kernel.shape[-1],))
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class RMSNorm(nnx.Module):
  """``x / sqrt(mean(x^2) + eps)``, normalised in float32 as ``transformers`` does, then scaled.

  ``offset=False`` (Llama, Qwen): ``w * normed.astype(dtype)``, ``w`` initialised to 1.
  ``offset=True`` (Gemma): ``(normed * (1 + w)).astype(dtype)`` in float32, ``w`` initialised
  to 0 (``transformers`` PR 29402: the scale is applied before the cast).
  """

  def __init__(self, dim, *, cfg: ModelConfig, offset: bool = False, axis: str = "norm"):
    init = jnp.zeros if offset else jnp.ones
    self.scale = nnx.Param(init((dim,), _dtype(cfg.param_dtype)), logical_axes=(axis,))
    self.eps = cfg.rms_norm_eps
    self.offset = offset
    self.dtype = _dtype(cfg.dtype)

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.offset:
      return (x32 * (1.0 + self.scale[...].astype(jnp.float32))).astype(self.dtype)
    return self.scale[...].astype(self.dtype) * x32.astype(self.dtype)


class LayerNorm(nnx.Module):
  """``(x - mean) / sqrt(var + eps) * w + b`` over the last axis, in float32 (the image towers:
  SigLIP, Qwen3-VL)."""

  def __init__(self, dim: int, eps: float, cfg: ModelConfig):
    pdt = _dtype(cfg.param_dtype)
    self.scale = nnx.Param(jnp.ones((dim,), pdt), logical_axes=("norm",))
    self.bias = nnx.Param(jnp.zeros((dim,), pdt), logical_axes=("norm",))
    self.eps = eps
    self.dtype = _dtype(cfg.dtype)

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
            ).astype(self.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: tuple | None) -> np.ndarray:
  """Inverse RoPE frequencies ``theta^(-2i/Dh)`` [Dh/2], with linear or Llama-3 scaling."""
  dim = head_dim
  inv = (1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)))
  inv = inv.astype(np.float32)
  rope = dict(scaling or ())
  kind = rope.get("rope_type", "default")
  if kind == "linear":
    inv = inv / np.float32(rope["factor"])
  elif kind == "llama3":
    factor = rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    inv = np.where(medium, smoothed, scaled).astype(np.float32)
  return inv


class Rope(NamedTuple):
  """The rotation of every position of a forward: cos, sin [B, S, Dh] float32."""
  cos: jax.Array
  sin: jax.Array

def mrope_components(mrope_section: tuple, interleaved: bool = False) -> np.ndarray:
  """The position component (0 temporal, 1 height, 2 width) of each of the Dh/2 frequencies:
  contiguous sections (Qwen2-VL), or interleaved (Qwen3-VL: frequency ``i`` takes height where
  ``i % 3 == 1`` and ``i < 3 * sections[1]``, width where ``i % 3 == 2`` and
  ``i < 3 * sections[2]``, else temporal)."""
  if not interleaved:
    return np.repeat(np.arange(len(mrope_section)) % 3, mrope_section)
  i = np.arange(sum(mrope_section))
  out = np.zeros_like(i)
  for axis in (1, 2):
    out[(i % 3 == axis) & (i < 3 * mrope_section[axis])] = axis
  return out


def rope_at(positions, inv_freq: np.ndarray, mrope_section: tuple | None = None,
            interleaved: bool = False) -> Rope:
  """cos/sin of ``positions`` [B, S] (computed once per forward, shared by the layers).

  M-RoPE (Qwen2-VL, Wang et al. 2024, "Qwen2-VL", sec. 2.1): ``positions`` [3, B, S] hold a
  (temporal, height, width) position per token, and frequency ``i`` of the Dh/2 turns with the
  component ``j`` whose section of ``mrope_section`` (sizes summing to Dh/2) holds ``i``. A text
  token has three equal components, so it rotates as plain RoPE at that position
  (``interleaved``: Qwen3-VL's assignment, ``mrope_components``). Positions
  [1, B, S] without ``mrope_section`` are plain RoPE."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  if positions.ndim == 3 and positions.shape[0] == 1 and mrope_section is None:
    freqs = freqs[0]  # one component: plain RoPE (a multimodal family without M-RoPE, Gemma 3)
  elif positions.ndim == 3:
    if mrope_section is None:
      raise ValueError("positions [3, B, S] (M-RoPE) need the model's mrope_section")
    component = mrope_components(mrope_section, interleaved)  # [Dh/2]
    freqs = jnp.take_along_axis(freqs, jnp.asarray(component)[None, None, None], axis=0)[0]
  emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, S, Dh]
  return Rope(jnp.cos(emb), jnp.sin(emb))


def rope_table(n_positions: int, inv_freq: np.ndarray) -> Rope:
  """cos/sin [n_positions, Dh] of positions 0 .. n_positions-1, to look up (``Rope.at``).

  A decode step looks its rotation up instead of computing it: XLA fuses ``cos``/``sin`` into
  their consumers and evaluates them again for every head of every layer, which cost 16% of a
  CPU decode step of a 6M-parameter model."""
  rope = rope_at(jnp.arange(n_positions)[None], inv_freq)
  return Rope(rope.cos[0], rope.sin[0])


def rope_lookup(table: Rope, positions) -> Rope:
  """The rows of ``table`` [N, Dh] at ``positions`` [B, S]."""
  return Rope(jnp.take(table.cos, positions, axis=0), jnp.take(table.sin, positions, axis=0))


def apply_rope(x, rope: Rope):
  """Rotate-half RoPE. x [B, S, N, Dh]."""
  cos = rope.cos[:, :, None, :].astype(x.dtype)
  sin = rope.sin[:, :, None, :].astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def _split(y, sizes):
  return jnp.split(y, np.cumsum(sizes)[:-1].tolist(), axis=-1)


class GatedMLP(nnx.Module):
  """``down(act(gate(x)) * up(x))``: SwiGLU (silu) or GeGLU (tanh-approximated gelu).

  With ``cfg.fused_mlp`` gate and up are one ``gate_up_proj`` kernel [D, 2F] (the sampler's
  layout, ``rljax.rollout.decode.inference_params``)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, width: int | None = None):
    d, f = cfg.hidden_size, width or cfg.intermediate_size
    self.width = f
    if cfg.fused_mlp:
      self.gate_up_proj = Linear(d, 2 * f, axes=("embed", "mlp"), bias=cfg.mlp_bias, cfg=cfg,
                                 rngs=rngs)
    else:
      self.gate_proj = Linear(d, f, axes=("embed", "mlp"), bias=cfg.mlp_bias, cfg=cfg, rngs=rngs,
                              target="gate_proj")
      self.up_proj = Linear(d, f, axes=("embed", "mlp"), bias=cfg.mlp_bias, cfg=cfg, rngs=rngs,
                            target="up_proj")
    self.down_proj = Linear(f, d, axes=("mlp", "embed"), bias=cfg.mlp_bias, cfg=cfg, rngs=rngs,
                            target="down_proj")
    self.act = ACTIVATIONS[cfg.hidden_act]
    self.fused = cfg.fused_mlp

  def __call__(self, x):
    if self.fused:
      gate, up = _split(self.gate_up_proj(x), [self.width, self.width])
    else:
      gate, up = self.gate_proj(x), self.up_proj(x)
    return self.down_proj(self.act(gate) * up)


class Attention(nnx.Module):
  """Grouped-query attention of layer ``layer``: projections (one fused q/k/v kernel with
  ``cfg.fused_qkv``), optional per-head q/k RMSNorm before RoPE (Qwen3, Gemma 3), the query
  scale (``query_pre_attn_scalar``, Gemma), the layer's window; the attention itself is the
  caller's ``attend``."""

  def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, qk_norm: bool = False,
               norm_offset: bool = False):
    d, h, g, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if cfg.fused_qkv:
      self.qkv_proj = Linear(d, (h + 2 * g) * dh, axes=("embed", "q_heads"), bias=cfg.qkv_bias,
                             cfg=cfg, rngs=rngs)
    else:
      self.q_proj = Linear(d, h * dh, axes=("embed", "q_heads"), bias=cfg.qkv_bias, cfg=cfg,
                           rngs=rngs, target="q_proj")
      self.k_proj = Linear(d, g * dh, axes=("embed", "kv_heads"), bias=cfg.qkv_bias, cfg=cfg,
                           rngs=rngs, target="k_proj")
      self.v_proj = Linear(d, g * dh, axes=("embed", "kv_heads"), bias=cfg.qkv_bias, cfg=cfg,
                           rngs=rngs, target="v_proj")
    self.o_proj = Linear(h * dh, d, axes=("q_heads", "embed"), bias=cfg.o_bias, cfg=cfg,
                         rngs=rngs, target="o_proj")
    if qk_norm:
      self.q_norm = RMSNorm(dh, cfg=cfg, offset=norm_offset, axis="head_dim")
      self.k_norm = RMSNorm(dh, cfg=cfg, offset=norm_offset, axis="head_dim")
    self.qk_norm = qk_norm
    self.heads = (h, g, dh)
    self.fused = cfg.fused_qkv
    self.window = cfg.layer_window(layer)
    # attention divides the scores by sqrt(Dh); a model that scales by another constant gets
    # its queries rescaled (exactly 1 when the constants agree).
    scalar = cfg.query_pre_attn_scalar
    self.query_scale = 1.0 if scalar is None else math.sqrt(dh) / math.sqrt(scalar)

  def project(self, x):
    """q [B, S, H, Dh], k, v [B, S, G, Dh] before RoPE."""
    b, s, _ = x.shape
    h, g, dh = self.heads
    if self.fused:
      q, k, v = _split(self.qkv_proj(x), [h * dh, g * dh, g * dh])
    else:
      q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    return q.reshape(b, s, h, dh), k.reshape(b, s, g, dh), v.reshape(b, s, g, dh)

  def __call__(self, x, rope: Rope, attend: Attend, layer_cache, last_only: bool = False):
    """x [B, S, D] -> ([B, Sq, D], layer_cache): Sq = 1 with ``last_only``, else S."""
    b = x.shape[0]
    q, k, v = self.project(x)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, rope), apply_rope(k, rope)
    if self.query_scale != 1.0:
      q = q * jnp.asarray(self.query_scale, q.dtype)
    if last_only:
      q = q[:, -1:]
    out, layer_cache = attend(q, k, v, layer_cache, self.window)
    return self.o_proj(out.reshape(b, q.shape[1], -1)), layer_cache


def residual(x, update):
  """``x + update`` where ``update`` covers the last positions of ``x`` only (``last_only``)."""
  return x[:, x.shape[1] - update.shape[1]:] + update

"""Decoder-only transformer of the Llama family (Llama 1-3, Mistral, Qwen2) in Flax NNX.

Matches ``transformers``' ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` numerically: RMSNorm in
float32, rotate-half RoPE (with Llama-3 / linear scaling), grouped-query attention with the softmax
in float32 and Mistral's sliding window (``rljax.models.attention``: one masking semantics, backends
by platform), SwiGLU MLP, tied or untied output embedding; per-layer remat policies, and
optionally (``scan_layers``) the cache-free forward as a ``lax.scan`` over the layers.

Parameters carry logical axis names (``Param(..., logical_axes=(...))``) that
``rljax.parallel`` maps onto mesh axes. The model is used functionally: ``init_params`` returns a
plain nested dict of arrays, and ``forward(cfg, params, ...)`` merges it into the module inside the
traced function, so jitted code takes and returns pytrees only.

Axis names: B batch, S query length, K key length (cache slots), D hidden, H query heads,
G key/value heads, R = H / G, Dh head dim, F MLP width, V vocab, L layers.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import attention as attention_lib
from rljax.models.config import ModelConfig

_MASK_VALUE = attention_lib.MASK_VALUE
# ``model.remat``: what each layer keeps for the backward pass. 'full' keeps only the layer's
# input and recomputes the rest; 'dots' also keeps the outputs of the weight matmuls (2-D GEMMs:
# ``Linear`` flattens its input), so the backward recomputes only norms, RoPE, activations and
# attention, never a projection; attention's batched dots and scores are not kept.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
_ONE_HOT_EMBED_MAX_VOCAB = 1024


def _dtype(name: str):
  return jnp.dtype(name)


class Linear(nnx.Module):
  """``y = x W (+ b)`` with ``W`` stored ``[in, out]`` and logical axis names."""

  def __init__(self, d_in, d_out, *, axes, bias, cfg: ModelConfig, rngs: nnx.Rngs, std=0.02):
    pdt = _dtype(cfg.param_dtype)
    self.kernel = nnx.Param(std * jax.random.normal(rngs.params(), (d_in, d_out), pdt),
                            logical_axes=axes)
    self.bias = nnx.Param(jnp.zeros((d_out,), pdt), logical_axes=axes[1:]) if bias else None
    self.dtype = _dtype(cfg.dtype)

  def __call__(self, x):
    # Flattened to a 2-D GEMM: XLA:CPU runs the weight gradient of a dot contracting two leading
    # axes ([B, S, in] x [B, S, out]) several times slower than the same [B*S] contraction.
    kernel = self.kernel[...].astype(self.dtype)
    y = jnp.dot(x.astype(self.dtype).reshape(-1, x.shape[-1]), kernel)
    y = y.reshape(x.shape[:-1] + (kernel.shape[-1],))
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y


class RMSNorm(nnx.Module):
  """``x / sqrt(mean(x^2) + eps) * w``, normalised in float32 as ``transformers`` does."""

  def __init__(self, dim, *, cfg: ModelConfig):
    self.scale = nnx.Param(jnp.ones((dim,), _dtype(cfg.param_dtype)), logical_axes=("norm",))
    self.eps = cfg.rms_norm_eps
    self.dtype = _dtype(cfg.dtype)

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(self.dtype) * x32.astype(self.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse RoPE frequencies ``theta^(-2i/Dh)`` [Dh/2], with linear or Llama-3 scaling."""
  dim = cfg.head_dim
  inv = (1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)))
  inv = inv.astype(np.float32)
  rope = cfg.rope_dict
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


def apply_rope(x, positions, inv_freq):
  """Rotate-half RoPE. x [B, S, N, Dh], positions [B, S] int."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, S, Dh]
  cos = jnp.cos(emb)[:, :, None, :].astype(x.dtype)
  sin = jnp.sin(emb)[:, :, None, :].astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


class LayerCache(NamedTuple):
  k: jax.Array  # [B, K, G, Dh]
  v: jax.Array  # [B, K, G, Dh]


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, h, g, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = Linear(d, h * dh, axes=("embed", "q_heads"), bias=cfg.qkv_bias, cfg=cfg,
                         rngs=rngs)
    self.k_proj = Linear(d, g * dh, axes=("embed", "kv_heads"), bias=cfg.qkv_bias, cfg=cfg,
                         rngs=rngs)
    self.v_proj = Linear(d, g * dh, axes=("embed", "kv_heads"), bias=cfg.qkv_bias, cfg=cfg,
                         rngs=rngs)
    self.o_proj = Linear(h * dh, d, axes=("q_heads", "embed"), bias=cfg.o_bias, cfg=cfg,
                         rngs=rngs)
    self.cfg = cfg

  def __call__(self, x, positions, k_valid, q_offset, cache: LayerCache | None, cache_index):
    """x [B, S, D]; k_valid [B, K] bool; query ``s`` sits at slot ``q_offset + s`` (causality
    and the sliding window by slot; ``rljax.models.attention``)."""
    cfg = self.cfg
    b, s, _ = x.shape
    h, g, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    inv_freq = rope_inv_freq(cfg)
    q = apply_rope(self.q_proj(x).reshape(b, s, h, dh), positions, inv_freq)
    k = apply_rope(self.k_proj(x).reshape(b, s, g, dh), positions, inv_freq)
    v = self.v_proj(x).reshape(b, s, g, dh)
    if cache is not None:
      k = jax.lax.dynamic_update_slice_in_dim(cache.k, k.astype(cache.k.dtype), cache_index, 1)
      v = jax.lax.dynamic_update_slice_in_dim(cache.v, v.astype(cache.v.dtype), cache_index, 1)
      cache = LayerCache(k, v)
    out = attention_lib.attention(q, k.astype(q.dtype), v.astype(q.dtype), k_valid,
                                  q_offset=q_offset, window=cfg.sliding_window,
                                  backend=cfg.attention, block=cfg.attention_block)
    out = out.reshape(b, s, h * dh)
    return self.o_proj(out), cache


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = Linear(d, f, axes=("embed", "mlp"), bias=cfg.mlp_bias, cfg=cfg, rngs=rngs)
    self.up_proj = Linear(d, f, axes=("embed", "mlp"), bias=cfg.mlp_bias, cfg=cfg, rngs=rngs)
    self.down_proj = Linear(f, d, axes=("mlp", "embed"), bias=cfg.mlp_bias, cfg=cfg, rngs=rngs)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm(cfg.hidden_size, cfg=cfg)
    self.self_attn = Attention(cfg, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg=cfg)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, positions, k_valid, q_offset, cache, cache_index):
    attn, cache = self.self_attn(self.input_layernorm(x), positions, k_valid, q_offset, cache,
                                 cache_index)
    x = x + attn
    return x + self.mlp(self.post_attention_layernorm(x)), cache


class Transformer(nnx.Module):
  """Embedding, ``num_layers`` blocks, final norm, and a head.

  ``head='lm'``: next-token logits (tied to the embedding when ``cfg.tie_embeddings``).
  ``head='value'``: a scalar value per position (the critic), no vocabulary projection.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, head: str = "lm"):
    if head not in ("lm", "value"):
      raise ValueError(f"head must be 'lm' or 'value', got {head!r}")
    pdt = _dtype(cfg.param_dtype)
    self.cfg = cfg
    self.head = head
    self.embed_tokens = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.hidden_size), pdt),
        logical_axes=("vocab", "embed"))
    self.num_layers = cfg.num_layers
    for i in range(cfg.num_layers):
      setattr(self, f"layers_{i}", Block(cfg, rngs=rngs))
    self.norm = RMSNorm(cfg.hidden_size, cfg=cfg)
    if head == "lm" and not cfg.tie_embeddings:
      self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, axes=("embed", "vocab"), bias=False,
                            cfg=cfg, rngs=rngs)
    if head == "value":
      self.value_head = Linear(cfg.hidden_size, 1, axes=("embed", None), bias=True, cfg=cfg,
                               rngs=rngs)

  def __call__(self, tokens, positions, *, attn_mask=None, cache=None, cache_index=None,
               kv_mask=None):
    """Final-norm hidden states.

    Without a cache: tokens, positions, attn_mask [B, S]; causal attention over valid tokens.
    With a cache (a tuple of LayerCache, one per layer, slots [B, K]): the S new tokens are
    written at slots ``cache_index .. cache_index+S-1`` and attend to every slot marked in
    ``kv_mask`` [B, K] up to their own. Returns (hidden [B, S, D], new cache or None).
    """
    x = self.embed(tokens)
    s = tokens.shape[1]
    if cache is None:
      if attn_mask is None:
        raise ValueError("attn_mask [B, S] is required without a KV cache")
      k_valid, q_offset = attn_mask.astype(bool), 0
    else:
      if kv_mask is None or cache_index is None:
        raise ValueError("kv_mask [B, K] and cache_index are required with a KV cache")
      k_valid, q_offset = kv_mask.astype(bool), cache_index
    policy = REMAT_POLICIES[self.cfg.remat]
    if cache is None and self.cfg.scan_layers:
      return self.norm(self._scan_blocks(x, positions, k_valid, policy)), None
    new_cache = []
    for i in range(self.num_layers):
      block = getattr(self, f"layers_{i}")
      layer_cache = None if cache is None else cache[i]
      if policy is None:
        x, layer_cache = block(x, positions, k_valid, q_offset, layer_cache, cache_index)
      else:
        # The query offset is closed over, not an argument: a static 0 must stay a Python int
        # (it selects the self-attention kernels), and remat would trace it.
        run = lambda blk, x_, pos, kv, lc: blk(x_, pos, kv, q_offset, lc, cache_index)
        x, layer_cache = nnx.remat(run, policy=policy)(block, x, positions, k_valid, layer_cache)
      new_cache.append(layer_cache)
    return self.norm(x), (None if cache is None else tuple(new_cache))

  def _scan_blocks(self, x, positions, k_valid, policy):
    """The blocks without a cache as one ``jax.lax.scan`` over their stacked parameters.

    ``x_{l+1} = block(x_l; W_l)`` for ``l = 0..L-1`` with ``W = stack(W_0..W_{L-1})`` built here,
    inside the traced function, so the parameter tree keeps its ``layers_i`` entries. The remat
    policy wraps the scanned body (``jax.checkpoint``): XLA cannot merge a loop body's
    recomputation back into the forward, which it does with an unrolled loop on CPU, so only
    this layout makes remat save memory there. Cost: one stacked copy of the layer weights
    during the step, and in the backward one of their gradients (unstacked into ``layers_i``).
    """
    graphdef, first = nnx.split(self.layers_0)
    states = [first] + [nnx.split(getattr(self, f"layers_{i}"))[1]
                        for i in range(1, self.num_layers)]
    stacked = jax.tree.map(lambda *ws: jnp.stack(ws), *states)

    def body(h, layer_state):
      # Query offset 0 and no cache: a static Python int selects the self-attention kernels.
      h, _ = nnx.merge(graphdef, layer_state)(h, positions, k_valid, 0, None, None)
      return h, None

    if policy is not None:
      body = jax.checkpoint(body, policy=policy)
    x, _ = jax.lax.scan(body, x, stacked)
    return x

  def embed(self, tokens):
    """Token embeddings [B, S, D] in the compute dtype.

    Small vocabularies use a one-hot matmul: its gradient is a GEMM, while the gather's gradient
    is a scatter-add, which XLA:CPU runs an order of magnitude slower. Both are exact.
    """
    dtype = _dtype(self.cfg.dtype)
    table = self.embed_tokens[...].astype(dtype)
    if self.cfg.vocab_size <= _ONE_HOT_EMBED_MAX_VOCAB:
      one_hot = jax.nn.one_hot(tokens.reshape(-1), self.cfg.vocab_size, dtype=dtype)
      return jnp.dot(one_hot, table).reshape(tokens.shape + (table.shape[-1],))
    return jnp.take(table, tokens, axis=0)

  def head_weight(self):
    """Output projection [D, V] in the compute dtype."""
    dtype = _dtype(self.cfg.dtype)
    if self.head != "lm":
      raise ValueError("a value model has no vocabulary head")
    if self.cfg.tie_embeddings:
      return self.embed_tokens[...].T.astype(dtype)
    return self.lm_head.kernel[...].astype(dtype)

  def logits(self, hidden):
    return jnp.dot(hidden, self.head_weight())

  def values(self, hidden):
    return self.value_head(hidden)[..., 0].astype(jnp.float32)


# --- functional API ------------------------------------------------------------------------------

def _abstract(cfg: ModelConfig, head: str):
  return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), head=head)))


def init_params(cfg: ModelConfig, seed: int = 0, head: str = "lm") -> dict:
  """Random parameters (normal, std 0.02; norms 1) as a plain nested dict of arrays."""
  _, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed), head=head))
  return nnx.to_pure_dict(state)


def param_shapes(cfg: ModelConfig, head: str = "lm") -> dict:
  """``jax.ShapeDtypeStruct`` for every parameter, without allocating any."""
  _, state = _abstract(cfg, head)
  return jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), nnx.to_pure_dict(state))


def logical_axes(cfg: ModelConfig, head: str = "lm") -> dict:
  """Logical axis names of every parameter, same tree as ``init_params``."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), head=head))
  axes = {}
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Variable):
      tree = axes
      for key in path[:-1]:
        tree = tree.setdefault(key, {})
      tree[path[-1]] = node.get_metadata()["logical_axes"]
  return axes


def bind(cfg: ModelConfig, params: dict, head: str = "lm") -> Transformer:
  """The module with ``params`` in it; call inside traced code (no copy is made)."""
  graphdef, _ = _abstract(cfg, head)
  return nnx.merge(graphdef, params)


def positions_from_mask(mask):
  """Position ids of left-padded rows: ``cumsum(mask) - 1``, 0 on padding. mask [B, S]."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(cfg: ModelConfig, params: dict, tokens, attn_mask, head: str = "lm"):
  """Full causal forward of left-padded rows: hidden [B, S, D] after the final norm."""
  model = bind(cfg, params, head)
  hidden, _ = model(tokens, positions_from_mask(attn_mask), attn_mask=attn_mask)
  return hidden


def logits(cfg: ModelConfig, params: dict, tokens, attn_mask):
  """Full causal forward returning logits [B, S, V] (tests and small models only)."""
  model = bind(cfg, params)
  hidden, _ = model(tokens, positions_from_mask(attn_mask), attn_mask=attn_mask)
  return model.logits(hidden)


def init_cache(cfg: ModelConfig, batch: int, slots: int):
  """Zeroed KV cache: a tuple (one per layer) of LayerCache with k, v [B, K, G, Dh]."""
  shape = (batch, slots, cfg.num_kv_heads, cfg.head_dim)
  dtype = _dtype(cfg.dtype)
  return tuple(LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
               for _ in range(cfg.num_layers))


def cached_step(cfg: ModelConfig, params: dict, tokens, positions, cache, cache_index, kv_mask):
  """Prefill (S > 1) or decode (S = 1) through the cache: (hidden [B, S, D], new cache)."""
  model = bind(cfg, params)
  return model(tokens, positions, cache=cache, cache_index=cache_index, kv_mask=kv_mask)


def head_weight(cfg: ModelConfig, params: dict):
  """The [D, V] output projection (for chunked log-probs that never build [B, T, V])."""
  return bind(cfg, params).head_weight()

"""One-token decode step of the Llama-family model, specialised for the sampler's inner loop.

Numerically the same computation as ``llama.cached_step`` with ``S = 1`` (the tests check the
sampler's log-probs against a teacher-forced ``llama.forward``), organised for speed:

- the KV cache is **head-major**, ``k, v [B, G, K, Dh]``: attention is then a batched matmul with
  the batch dimensions leading, so XLA does not transpose the whole cache on every step (with the
  model's ``[B, K, G, Dh]`` layout it does, which costs more than the rest of the step on CPU);
- the q/k/v projections and the gate/up projections are each one matmul on kernels concatenated
  once per ``sample`` call (``fuse_weights``, outside the loop).

Norms, RoPE and the residual structure reuse ``rljax.models.llama`` (``RMSNorm`` semantics,
``apply_rope``, ``rope_inv_freq``); the parameter tree is the model's, unchanged.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import llama
from rljax.models.config import ModelConfig


def _rms_norm(cfg: ModelConfig, scale, x):
  """``llama.RMSNorm``: normalise in float32, scale in the compute dtype."""
  dtype = jnp.dtype(cfg.dtype)
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + cfg.rms_norm_eps)
  return scale.astype(dtype) * x32.astype(dtype)


def _cat(parts, dtype):
  return jnp.concatenate([p.astype(dtype) for p in parts], axis=-1)


def fuse_weights(cfg: ModelConfig, params: dict) -> dict:
  """Decode-ready weights: per layer fused ``qkv`` [D, (H+2G) Dh] and ``gate_up`` [D, 2F] kernels
  (and biases), all in the compute dtype; ``embed`` [V, D] and ``head`` [D, V]."""
  dtype = jnp.dtype(cfg.dtype)
  layers = []
  for i in range(cfg.num_layers):
    lp = params[f"layers_{i}"]
    attn, mlp = lp["self_attn"], lp["mlp"]
    w = {
        "ln1": lp["input_layernorm"]["scale"],
        "ln2": lp["post_attention_layernorm"]["scale"],
        "qkv": _cat([attn[f"{n}_proj"]["kernel"] for n in "qkv"], dtype),
        "o": attn["o_proj"]["kernel"].astype(dtype),
        "gate_up": _cat([mlp["gate_proj"]["kernel"], mlp["up_proj"]["kernel"]], dtype),
        "down": mlp["down_proj"]["kernel"].astype(dtype),
    }
    if cfg.qkv_bias:
      w["qkv_b"] = _cat([attn[f"{n}_proj"]["bias"] for n in "qkv"], dtype)
    if cfg.o_bias:
      w["o_b"] = attn["o_proj"]["bias"].astype(dtype)
    if cfg.mlp_bias:
      w["gate_up_b"] = _cat([mlp["gate_proj"]["bias"], mlp["up_proj"]["bias"]], dtype)
      w["down_b"] = mlp["down_proj"]["bias"].astype(dtype)
    layers.append(w)
  return {"layers": tuple(layers), "embed": params["embed_tokens"], "norm": params["norm"]["scale"],
          "head": llama.head_weight(cfg, params)}


def _dense(x, kernel, bias=None):
  y = jnp.dot(x.astype(kernel.dtype), kernel)
  return y if bias is None else y + bias


def head_major(cache) -> tuple:
  """The model's cache ``[B, K, G, Dh]`` per layer -> ``(k, v)`` pairs ``[B, G, K, Dh]``."""
  return tuple((c.k.transpose(0, 2, 1, 3), c.v.transpose(0, 2, 1, 3)) for c in cache)


def decode_step(cfg: ModelConfig, w: dict, tokens, positions, cache, slot, kv_valid):
  """Feed one token per row at cache slot ``slot``; return (final-norm hidden [B, D], cache).

  tokens, positions: [B] int. cache: per layer ``(k, v)`` [B, G, K, Dh]. kv_valid: [B, K] bool,
  the slots (prompt tokens and completion slots) a query may attend to, up to its own slot.
  """
  dtype = jnp.dtype(cfg.dtype)
  b = tokens.shape[0]
  h, g, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  inv_freq = llama.rope_inv_freq(cfg)
  k_slots = cache[0][0].shape[2]
  allowed = kv_valid & (jnp.arange(k_slots)[None, :] <= slot)  # [B, K]
  allowed = allowed[:, None, None, :]
  pos = positions[:, None]
  x = jnp.take(w["embed"], tokens, axis=0).astype(dtype)  # [B, D]
  new_cache = []
  for lw, (ck, cv) in zip(w["layers"], cache):
    y = _rms_norm(cfg, lw["ln1"], x)
    qkv = _dense(y, lw["qkv"], lw.get("qkv_b"))
    q = qkv[:, :h * dh].reshape(b, 1, h, dh)
    k = qkv[:, h * dh:(h + g) * dh].reshape(b, 1, g, dh)
    v = qkv[:, (h + g) * dh:].reshape(b, g, 1, dh)
    q = llama.apply_rope(q, pos, inv_freq).reshape(b, g, h // g, dh)
    k = llama.apply_rope(k, pos, inv_freq).reshape(b, g, 1, dh)
    ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, 0, slot, 0))
    cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, 0, slot, 0))
    new_cache.append((ck, cv))
    scores = jnp.einsum("bgrd,bgkd->bgrk", q, ck.astype(q.dtype)).astype(jnp.float32)
    scores = scores / np.float32(math.sqrt(dh))
    scores = jnp.where(allowed, scores, llama._MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(cv.dtype)
    attn = jnp.einsum("bgrk,bgkd->bgrd", probs, cv).reshape(b, h * dh)
    x = x + _dense(attn, lw["o"], lw.get("o_b"))
    y = _rms_norm(cfg, lw["ln2"], x)
    gate, up = jnp.split(_dense(y, lw["gate_up"], lw.get("gate_up_b")), 2, axis=-1)
    x = x + _dense(jax.nn.silu(gate) * up, lw["down"], lw.get("down_b"))
  return _rms_norm(cfg, w["norm"], x), tuple(new_cache)

"""Prefill and one-token decode of the Llama-family model, specialised for the sampler.

Numerically the same computation as ``llama.cached_step`` (the tests check the sampler's
log-probs against a teacher-forced ``llama.forward`` and its greedy tokens against
``transformers``), organised for speed:

- the KV cache is **head-major**, ``k, v [B, G, K, Dh]``: attention is then a batched matmul with
  the batch dimensions leading, so XLA does not transpose the whole cache on every step (with the
  model's ``[B, K, G, Dh]`` layout it does, which costs more than the rest of the step on CPU);
- the q/k/v projections and the gate/up projections are each one matmul on kernels concatenated
  once per ``sample`` call (``fuse_weights``, outside the loop), except on CPU where a fused
  kernel would exceed ``CPU_MAX_FUSED_KERNEL_BYTES``;
- prefill needs the next-token logits of the last prompt token only: the last layer runs its
  attention, o-projection and MLP for that position alone (its keys and values go to the cache
  for every position), and only that position is normalised and returned.

Norms, RoPE and the residual structure follow ``rljax.models.llama`` (``RMSNorm`` semantics,
``apply_rope`` with its ``rope_inv_freq``, looked up from a table built once per call); the
parameter tree is the model's, unchanged.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import attention as attention_lib
from rljax.models import llama
from rljax.models.config import ModelConfig


def _rms_norm(cfg: ModelConfig, scale, x):
  """``llama.RMSNorm``: normalise in float32, scale in the compute dtype."""
  dtype = jnp.dtype(cfg.dtype)
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + cfg.rms_norm_eps)
  return scale.astype(dtype) * x32.astype(dtype)


# On the CPU backend a matmul whose kernel exceeds about this many bytes runs at about half the
# FLOP/s of smaller ones (XLA:CPU's matmul library, measured for the few rows a decode step has:
# [16, 128] @ [128, 512] 224 GFLOP/s, @ [128, 1024] 116 GFLOP/s on one EPYC core). Projections are
# fused into one matmul only while the fused kernel stays within it; elsewhere always.
CPU_MAX_FUSED_KERNEL_BYTES = 256 << 10
# The backends that this CPU tuning (and the sampler's cache blocking) applies to; the tests add
# the backend they run on, to exercise those paths on any machine.
CPU_TUNED_BACKENDS = ("cpu",)


def _cat(parts, dtype):
  return jnp.concatenate([p.astype(dtype) for p in parts], axis=-1)


def _fuse_or_keep(modules, dtype) -> tuple:
  """(kernels, biases) of projection ``modules``: one concatenated kernel [D, sum N_i] (and bias),
  or the kernels [D, N_i] (and biases) kept apart on CPU when the fused kernel would be too large
  to run fast (``CPU_MAX_FUSED_KERNEL_BYTES``). Biases are ``None`` where the modules have none."""
  kernels = [m["kernel"] for m in modules]
  biases = [m.get("bias") for m in modules]
  biases = None if biases[0] is None else biases
  fused_bytes = sum(k.size for k in kernels) * jnp.dtype(dtype).itemsize
  if jax.default_backend() in CPU_TUNED_BACKENDS and fused_bytes > CPU_MAX_FUSED_KERNEL_BYTES:
    keep = lambda parts: tuple(p.astype(dtype) for p in parts)
  else:
    keep = lambda parts: (_cat(parts, dtype),)
  return keep(kernels), None if biases is None else keep(biases)


def rope_tables(cfg: ModelConfig, n_positions: int):
  """``cos, sin`` [n_positions, Dh] of ``llama.apply_rope`` for positions 0 .. n_positions-1."""
  inv_freq = jnp.asarray(llama.rope_inv_freq(cfg))
  freqs = jnp.arange(n_positions, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def _rope(x, cos, sin):
  """``llama.apply_rope`` with the rotation looked up, not recomputed. x [B, S, N, Dh]; cos, sin
  [B, S, Dh]. (Computed inside a fusion, the cos/sin would be re-evaluated for every head.)"""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, :, None].astype(x.dtype) + rotated * sin[:, :, None].astype(x.dtype)


def fuse_weights(cfg: ModelConfig, params: dict, n_positions: int) -> dict:
  """Decode-ready weights, all in the compute dtype: per layer ``qkv`` (the q, k, v kernels
  [D, (H+2G) Dh] as one fused kernel, or three) and ``gate_up`` (gate and up [D, 2F], fused or
  two), with biases alike (``None`` where the model has none); ``embed`` [V, D], ``head`` [D, V],
  and RoPE tables ``cos``/``sin`` for positions below ``n_positions``."""
  dtype = jnp.dtype(cfg.dtype)
  layers = []
  for i in range(cfg.num_layers):
    lp = params[f"layers_{i}"]
    attn, mlp = lp["self_attn"], lp["mlp"]
    qkv, qkv_b = _fuse_or_keep([attn[f"{n}_proj"] for n in "qkv"], dtype)
    gate_up, gate_up_b = _fuse_or_keep([mlp["gate_proj"], mlp["up_proj"]], dtype)
    w = {
        "ln1": lp["input_layernorm"]["scale"],
        "ln2": lp["post_attention_layernorm"]["scale"],
        "qkv": qkv,
        "qkv_b": qkv_b,
        "o": attn["o_proj"]["kernel"].astype(dtype),
        "o_b": attn["o_proj"]["bias"].astype(dtype) if cfg.o_bias else None,
        "gate_up": gate_up,
        "gate_up_b": gate_up_b,
        "down": mlp["down_proj"]["kernel"].astype(dtype),
        "down_b": mlp["down_proj"]["bias"].astype(dtype) if cfg.mlp_bias else None,
    }
    layers.append(w)
  cos, sin = rope_tables(cfg, n_positions)
  return {"layers": tuple(layers), "embed": params["embed_tokens"], "norm": params["norm"]["scale"],
          "head": llama.head_weight(cfg, params), "cos": cos, "sin": sin}


def _dense(x, kernel, bias=None):
  y = jnp.dot(x.astype(kernel.dtype), kernel)
  return y if bias is None else y + bias


def _projections(x, kernels: tuple, biases, sizes: list[int]) -> list:
  """The outputs of ``len(sizes)`` projections of ``x`` [N, D] (widths ``sizes``), computed by
  one fused matmul and split, or by one matmul each (``fuse_weights``)."""
  biases = biases or (None,) * len(kernels)
  outs = [_dense(x, k, b) for k, b in zip(kernels, biases)]
  if len(outs) == len(sizes):
    return outs
  return jnp.split(outs[0], np.cumsum(sizes)[:-1].tolist(), axis=-1)


def init_cache(cfg: ModelConfig, batch: int, slots: int) -> tuple:
  """Zeroed head-major cache: per layer ``(k, v)`` [B, G, K, Dh] in the compute dtype."""
  shape = (batch, cfg.num_kv_heads, slots, cfg.head_dim)
  dtype = jnp.dtype(cfg.dtype)
  return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers))


def _cache_attention(q, ck, cv, allowed):
  """Queries q [B, Sq, H, Dh] against the head-major cache ck, cv [B, G, K, Dh] (``allowed``
  [B, 1, 1, Sq, K]): ``attention.reference_attention`` with batch dimensions leading, so XLA
  does not transpose the cache every step. Returns [B * Sq, H * Dh]."""
  b, sq, h, dh = q.shape
  g, k_slots = ck.shape[1], ck.shape[2]
  r = h // g
  q = q.reshape(b, sq, g, r, dh).transpose(0, 2, 3, 1, 4).reshape(b, g, r * sq, dh)
  scores = jnp.einsum("bgqd,bgkd->bgqk", q, ck.astype(q.dtype)).astype(jnp.float32)
  scores = scores.reshape(b, g, r, sq, k_slots) / np.float32(math.sqrt(dh))
  scores = jnp.where(allowed, scores, attention_lib.MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(cv.dtype).reshape(b, g, r * sq, k_slots)
  attn = jnp.einsum("bgqk,bgkd->bgqd", probs, cv).reshape(b, g, r, sq, dh)
  return attn.transpose(0, 3, 1, 2, 4).reshape(b * sq, h * dh)


def _write(cache, x, slot, per_row: bool):
  """``x`` [B, G, S, Dh] into ``cache`` [B, G, K, Dh] at slot ``slot`` (or ``slot[b]`` per row)."""
  x = x.astype(cache.dtype)
  if per_row:
    put = lambda c, u, s: jax.lax.dynamic_update_slice(c, u, (0, s, 0))
    return jax.vmap(put)(cache, x, slot)
  return jax.lax.dynamic_update_slice(cache, x, (0, 0, slot, 0))


def _mlp(cfg: ModelConfig, lw: dict, x):
  """The layer's second half: ``x + down(silu(gate(y)) * up(y))``, ``y = ln2(x)``."""
  y = _rms_norm(cfg, lw["ln2"], x)
  f = cfg.intermediate_size
  gate, up = _projections(y, lw["gate_up"], lw["gate_up_b"], [f, f])
  return x + _dense(jax.nn.silu(gate) * up, lw["down"], lw["down_b"])


def step(cfg: ModelConfig, w: dict, tokens, positions, cache, slot, kv_valid, attend=None):
  """Feed ``S`` tokens per row at cache slots ``slot .. slot+S-1``: prefill (S = P) or decode
  (S = 1). Returns (final-norm hidden of the *last* token [B, D], cache).

  tokens, positions: [B, S] int. cache: per layer ``(k, v)`` [B, G, K, Dh]. kv_valid: [B, K]
  bool, the slots a query may attend to (prompt tokens and completion slots), each query only up
  to its own slot. ``slot``: one int for every row, or a [B] int array (continuous batching:
  every row writes at its own slot). Only the last position goes through the last layer's
  attention and MLP and the final norm: the sampler needs nothing else, and ``[B, S, V]``
  logits are never formed.

  ``attend``: None, or ``attend(q [B, 1, H, Dh], k, v [B, 1, G, Dh], layer_cache) -> (attn
  [B, H * Dh], layer_cache)``, a decode step (S = 1) whose cache has another layout: it writes
  ``k, v`` and attends (continuous batching's cache blocks); ``slot`` and ``kv_valid`` are then
  unused.
  """
  dtype = jnp.dtype(cfg.dtype)
  b, s = tokens.shape
  h, g, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  cos, sin = jnp.take(w["cos"], positions, axis=0), jnp.take(w["sin"], positions, axis=0)
  # A prefill into an empty cache (``slot`` the static 0) attends to its own S keys only, not to
  # the empty slots that the cache holds for decoding: that is ``rljax.models.attention`` (the
  # training forward's attention, whose backend ``cfg.attention`` picks). Decode steps attend to
  # the head-major cache here.
  from_empty = isinstance(slot, int) and slot == 0
  per_row = attend is None and jnp.ndim(slot) == 1  # continuous batching: a slot per row
  if attend is not None and s != 1:
    raise ValueError(f"decode.step with attend= feeds one token per row, got {s}")
  if not from_empty and attend is None:
    k_slots = cache[0][0].shape[2]
    q_slots = jnp.broadcast_to((slot[:, None] if per_row else slot) + jnp.arange(s), (b, s))
    k_index = jnp.arange(k_slots)
    ok = k_index[None, None, :] <= q_slots[:, :, None]
    if cfg.sliding_window is not None:
      ok = ok & (q_slots[:, :, None] - k_index[None, None, :] < cfg.sliding_window)
    allowed = (ok & kv_valid[:, None, :k_slots])[:, None, None]  # [B, 1, 1, S, K]
  x = jnp.take(w["embed"], tokens.reshape(-1), axis=0).astype(dtype)  # [B*S, D]
  new_cache = []
  for i, (lw, layer_cache) in enumerate(zip(w["layers"], cache)):
    y = _rms_norm(cfg, lw["ln1"], x)
    q, k, v = _projections(y, lw["qkv"], lw["qkv_b"], [h * dh, g * dh, g * dh])
    q = _rope(q.reshape(b, s, h, dh), cos, sin)  # [B, S, H, Dh]
    k = _rope(k.reshape(b, s, g, dh), cos, sin)  # [B, S, G, Dh]
    v = v.reshape(b, s, g, dh)
    sq = s  # queries
    if attend is not None:  # the caller's cache layout: it writes k, v and attends
      attn, layer_cache = attend(q, k, v, layer_cache)
    else:
      ck, cv = layer_cache
      k, v = k.astype(ck.dtype), v.astype(cv.dtype)
      # Head-major: [B, G, S, Dh] (a free reshape when S = 1).
      ck = _write(ck, k.transpose(0, 2, 1, 3), slot, per_row)
      cv = _write(cv, v.transpose(0, 2, 1, 3), slot, per_row)
      layer_cache = (ck, cv)
      if i == cfg.num_layers - 1 and s > 1:
        # The last layer's keys and values are needed at every position (the cache), its output
        # only at the last one: attention, o-projection and MLP run for that query alone.
        sq, q = 1, q[:, -1:]
        x = x.reshape(b, s, -1)[:, -1]
      if from_empty:
        attn = attention_lib.attention(q, k, v, kv_valid[:, :s], q_offset=s - sq,
                                       window=cfg.sliding_window, backend=cfg.attention,
                                       block=cfg.attention_block)
        attn = attn.reshape(b * sq, h * dh)
      else:
        attn = _cache_attention(q, ck, cv, allowed[:, :, :, -sq:])
    new_cache.append(layer_cache)
    x = x + _dense(attn, lw["o"], lw["o_b"])
    x = _mlp(cfg, lw, x)
  last = x.reshape(b, sq, -1)[:, -1]
  return _rms_norm(cfg, w["norm"], last), tuple(new_cache)

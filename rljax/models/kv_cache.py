"""The sampler's KV cache: per layer ``(k, v)`` **head-major**, ``[B, G, K, Dh]``.

With the batch and head dimensions leading, attention over the cache is a batched matmul, so XLA
does not transpose the whole cache on every decode step (with a ``[B, K, G, Dh]`` layout it does,
which costs more than the rest of the step on CPU). ``attend_at`` is the attention strategy
(``rljax.models.layers.Attend``) of a forward that writes its keys and values at a slot:

- a prefill into an empty cache (``slot`` the static 0) attends to its own S keys only, through
  ``rljax.models.attention`` (the training forward's kernels, whose backend ``cfg.attention``
  picks), not to the empty slots the cache holds for decoding;
- otherwise (decode steps, ``slot`` one int or a [B] int array: every row at its own slot) the
  queries attend to the cache up to their own slot.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import attention as attention_lib
from rljax.models.config import ModelConfig

# Logical axes of one cache array (``rljax.parallel.rules`` maps them onto the mesh).
CACHE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")


def init_cache(cfg: ModelConfig, batch: int, slots: int) -> tuple:
  """Zeroed head-major cache: per layer ``(k, v)`` [B, G, K, Dh] in the compute dtype."""
  shape = (batch, cfg.num_kv_heads, slots, cfg.head_dim)
  dtype = jnp.dtype(cfg.dtype)
  return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers))


def cache_attention(q, ck, cv, allowed):
  """Queries q [B, Sq, H, Dh] against the head-major cache ck, cv [B, G, K, Dh] (``allowed``
  [B, 1, 1, Sq, K]): ``attention.reference_attention`` with batch dimensions leading. Returns
  [B, Sq, H, Dh]."""
  b, sq, h, dh = q.shape
  g, k_slots = ck.shape[1], ck.shape[2]
  r = h // g
  q = q.reshape(b, sq, g, r, dh).transpose(0, 2, 3, 1, 4).reshape(b, g, r * sq, dh)
  scores = jnp.einsum("bgqd,bgkd->bgqk", q, ck.astype(q.dtype)).astype(jnp.float32)
  scores = scores.reshape(b, g, r, sq, k_slots) / np.float32(math.sqrt(dh))
  scores = jnp.where(allowed, scores, attention_lib.MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(cv.dtype).reshape(b, g, r * sq, k_slots)
  attn = jnp.einsum("bgqk,bgkd->bgqd", probs, cv).reshape(b, g, r, sq, dh)
  return attn.transpose(0, 3, 1, 2, 4)


def _write(cache, x, slot, per_row: bool):
  """``x`` [B, G, S, Dh] into ``cache`` [B, G, K, Dh] at slot ``slot`` (or ``slot[b]`` per row)."""
  x = x.astype(cache.dtype)
  if per_row:
    put = lambda c, u, s: jax.lax.dynamic_update_slice(c, u, (0, s, 0))
    return jax.vmap(put)(cache, x, slot)
  return jax.lax.dynamic_update_slice(cache, x, (0, 0, slot, 0))


def attend_at(cfg: ModelConfig, slot, kv_valid, s: int):
  """The strategy of a forward of ``s`` tokens per row written at cache slots ``slot ..
  slot+s-1``; ``kv_valid`` [B, K] the slots a query may attend to (each only up to its own)."""
  from_empty = isinstance(slot, int) and slot == 0
  per_row = jnp.ndim(slot) == 1
  allowed_by_window = {}  # one mask per distinct window, built once per forward

  def allowed(window, k_slots):
    if window not in allowed_by_window:
      b = kv_valid.shape[0]
      q_slots = jnp.broadcast_to((slot[:, None] if per_row else slot) + jnp.arange(s), (b, s))
      k_index = jnp.arange(k_slots)
      ok = k_index[None, None, :] <= q_slots[:, :, None]
      if window is not None:
        ok = ok & (q_slots[:, :, None] - k_index[None, None, :] < window)
      allowed_by_window[window] = (ok & kv_valid[:, None, :k_slots])[:, None, None]
    return allowed_by_window[window]

  def attend(q, k, v, layer_cache, window):
    ck, cv = layer_cache
    k, v = k.astype(ck.dtype), v.astype(cv.dtype)
    ck = _write(ck, k.transpose(0, 2, 1, 3), slot, per_row)  # head-major [B, G, S, Dh]
    cv = _write(cv, v.transpose(0, 2, 1, 3), slot, per_row)
    sq = q.shape[1]
    if from_empty:
      out = attention_lib.attention(q, k, v, kv_valid[:, :s], q_offset=s - sq, window=window,
                                    backend=cfg.attention, block=cfg.attention_block)
    else:
      out = cache_attention(q, ck, cv, allowed(window, ck.shape[2])[:, :, :, -sq:])
    return out, (ck, cv)
  return attend

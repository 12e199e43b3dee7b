"""The continuous loop's KV cache in blocks, so that a decode step reads only the filled part.

Continuous batching (``continuous.py``) gives every slot its own cache region of ``P + T``
positions, and its slots sit at different depths. Attending over the whole region at every step
(what one ``[S, G, P + T, Dh]`` array makes a batched matmul do) costs a slot ``P + T`` keys
however few it has filled: on CPU that was most of a step (the long-tail benchmark, see
docs/rollout.md). Here each layer's cache is a *prompt block* ``[S, G, P, Dh]`` and completion
blocks ``[S, G, Kb, Dh]`` (``Kb = BLOCK_SLOTS``, the last one smaller), each its own array:

- a step writes each slot's key/value into the block that holds its position (one scatter per
  block, rows outside it dropped);
- it attends over the prompt block and the first ``n`` completion blocks, ``n`` the fewest that
  hold the deepest active slot's positions (``lax.switch`` over ``n``, one branch per count).

Separate arrays matter: a slice of a prefix of one ``[.., P + T, ..]`` array is a copy on XLA:CPU
(it costs more than reading the whole array), while each branch here reads whole blocks in place.
The keys a slot may see are the same as in ``rljax.models.kv_cache`` (its real prompt tokens, its own
completion positions up to the current one, the sliding window), and the softmax runs over them
at once, so the result is ``kv_cache.cache_attention``'s up to float rounding of the block sums.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import attention as attention_lib
from rljax.models.config import ModelConfig

# Completion positions per block: larger blocks mean fewer ops per step, smaller ones less
# reading past the deepest slot (64 measured faster than 32 on CPU, docs/rollout.md).
BLOCK_SLOTS = 64


def block_sizes(t_max: int, block: int = BLOCK_SLOTS) -> tuple[int, ...]:
  """Completion block sizes covering ``t_max`` positions: ``block`` each, the last one less."""
  return tuple(min(block, t_max - start) for start in range(0, t_max, block))


def init_cache(cfg: ModelConfig, slots: int, p: int, sizes: tuple[int, ...]) -> tuple:
  """Zeroed cache: per layer ``(prompt (k, v) [S, G, P, Dh], ((k, v) [S, G, Kb_j, Dh], ...))``."""
  dtype = jnp.dtype(cfg.dtype)
  pair = lambda width: tuple(jnp.zeros((slots, cfg.num_kv_heads, width, cfg.head_dim), dtype)
                             for _ in range(2))
  return tuple((pair(p), tuple(pair(n) for n in sizes)) for _ in range(cfg.num_layers))


def blocks_needed(t, sizes: tuple[int, ...]):
  """Completion blocks holding positions ``0 .. t-1`` (``t`` >= 1 a traced int): 1 .. len."""
  ends = jnp.asarray(np.cumsum(sizes), jnp.int32)
  return jnp.clip(jnp.searchsorted(ends, t, side="left") + 1, 1, len(sizes))


def attend(q, k, v, layer_cache, window: int | None, *, t, n_blocks, prompt_valid,
           sizes: tuple[int, ...]):
  """Write ``k, v`` [S, Sq, G, Dh] at each slot's completion positions ``t - 1 .. t + Sq - 2``,
  then attend ``q`` [S, Sq, H, Dh] to its prompt and completion keys, query ``j`` up to its own
  position (``rljax.models.layers.Attend``, with the other arguments bound by the caller).
  ``Sq`` = 1 decodes; ``Sq = k + 1`` verifies ``k`` drafted tokens (speculative decoding).

  t: [S] int, completion tokens of each slot including the first one fed now. n_blocks: the
  traced number of completion blocks read (``blocks_needed`` of the deepest active slot's last
  position + 1). prompt_valid: [S, P] bool, the slot's real prompt tokens. Returns
  ([S, Sq, H, Dh], layer_cache).
  """
  (pk, pv), blocks = layer_cache
  slots, _, p, _ = pk.shape
  sq = q.shape[1]
  rows = jnp.arange(slots)[:, None]
  starts = np.cumsum((0,) + sizes[:-1]).tolist()
  new_blocks = []
  for (ck, cv), start, size in zip(blocks, starts, sizes):
    at = (t - 1 - start)[:, None] + jnp.arange(sq)[None]  # [S, Sq]
    at = jnp.where((at >= 0) & (at < size), at, size)  # out of the block: dropped
    put = lambda c, x, at=at: c.at[rows, :, at].set(x.astype(c.dtype), mode="drop")
    new_blocks.append((put(ck, k), put(cv, v)))
  new_blocks = tuple(new_blocks)

  b, sq, h, dh = q.shape
  g = pk.shape[1]
  r = h // g
  qh = q.reshape(b, sq, g, r, dh).transpose(0, 2, 3, 1, 4).reshape(b, g, r * sq, dh)

  def over(n: int):
    """Attention over the prompt block and the first ``n`` completion blocks."""
    def run(qh, pk, pv, blocks):
      keys = [pk] + [blocks[j][0] for j in range(n)]
      values = [pv] + [blocks[j][1] for j in range(n)]
      width = sum(sizes[:n])
      scores = jnp.concatenate([jnp.einsum("bgqd,bgkd->bgqk", qh, kb.astype(qh.dtype))
                                for kb in keys], axis=-1).astype(jnp.float32)
      scores = scores.reshape(b, g, r, sq, p + width) / np.float32(math.sqrt(dh))
      ends = t[:, None] + jnp.arange(sq)[None]  # [S, Sq]: query j sees positions < t + j
      allowed = jnp.concatenate(
          [jnp.broadcast_to(prompt_valid[:, None], (b, sq, p)),
           jnp.arange(width)[None, None] < ends[..., None]], axis=2)
      if window is not None:  # query j sits at slot P + t - 1 + j
        allowed = allowed & (p + ends[..., None] - 1 - jnp.arange(p + width)[None, None]
                             < window)
      scores = jnp.where(allowed[:, None, None], scores, attention_lib.MASK_VALUE)
      probs = jax.nn.softmax(scores, axis=-1).astype(pv.dtype).reshape(b, g, r * sq, p + width)
      bounds = np.cumsum([p] + [sizes[j] for j in range(n)])[:-1].tolist()
      parts = [jnp.einsum("bgqk,bgkd->bgqd", pr, vb)
               for pr, vb in zip(jnp.split(probs, bounds, axis=-1), values)]
      attn = parts[0]
      for part in parts[1:]:
        attn = attn + part
      return attn.reshape(b, g, r, sq, dh).transpose(0, 3, 1, 2, 4)
    return run

  branches = [over(n) for n in range(1, len(sizes) + 1)]
  attn = jax.lax.switch(n_blocks - 1, branches, qh, pk, pv, new_blocks)
  return attn, ((pk, pv), new_blocks)

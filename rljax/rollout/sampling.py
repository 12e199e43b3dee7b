"""Sampling parameters and transforms: what distribution the next token is drawn from.

``SamplingParams`` is static (hashable): transforms that are off are not traced at all.
``process_logits`` gives the processed distribution's logits; ``pick_tokens`` draws one token per
row and reports its log-prob under the policy (raw logits, ``sampler_logp``) and under the
processed distribution (``draw_logp``); ``pick_tokens_rows`` does the same with a key per row.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rljax.rollout import noise


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample. Hashable: it is a static argument (a new value means a new compilation).

  Transforms are applied in this order to the float32 logits: temperature, top-k, top-p, min-p
  (each is skipped at trace time when off). ``greedy=True`` (or ``temperature=0``) takes the
  argmax of the raw logits and ignores the other transforms.

  Attributes:
    temperature: divides the logits (> 0; 0 means greedy).
    top_k: keep the ``k`` largest logits (ties at the k-th value kept); 0 = off.
    top_p: nucleus: keep the smallest prefix of the sorted distribution whose mass reaches
      ``top_p`` (the most likely token is always kept); 1.0 = off.
    min_p: keep tokens with ``p >= min_p * p_max``; 0.0 = off.
    greedy: argmax decoding.
    max_new_tokens: ``T``, the completion budget and the padded completion width.
    stop_ids: token ids that end a completion (EOS and any other stop tokens). The stop token is
      part of the completion (mask 1). ``None`` (the default): the model's EOS ids
      (``ModelConfig.eos_token_id``), as ``transformers`` ``generate`` does; ``()``: always
      generate ``T`` tokens.
    pad_id: written after a completion has stopped.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  min_p: float = 0.0
  greedy: bool = False
  max_new_tokens: int = 64
  stop_ids: tuple | None = None
  pad_id: int = 0

  def __post_init__(self):
    if isinstance(self.stop_ids, (int, np.integer)):
      object.__setattr__(self, "stop_ids", (int(self.stop_ids),))
    if self.stop_ids is not None:
      object.__setattr__(self, "stop_ids", tuple(int(s) for s in self.stop_ids))
    if self.temperature < 0:
      raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), "
                       f"got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"SamplingParams.top_p must be in (0, 1] (1 = off), got {self.top_p}")
    if not 0.0 <= self.min_p < 1.0:
      raise ValueError(f"SamplingParams.min_p must be in [0, 1) (0 = off), got {self.min_p}")
    if self.max_new_tokens < 1:
      raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")

  @property
  def is_greedy(self) -> bool:
    return self.greedy or self.temperature == 0.0


def process_logits(logits: jax.Array, sp: SamplingParams) -> jax.Array:
  """The sampling distribution's logits: temperature, top-k, top-p, min-p. logits [..., V] f32.

  Removed tokens get ``-inf``; ``log_softmax`` of the result is the processed log-distribution.
  Transforms that are off are not traced at all (``sp`` is static).
  """
  x = logits.astype(jnp.float32)
  if sp.is_greedy:
    raise ValueError("process_logits is for sampling; greedy decoding takes the argmax")
  vocab = x.shape[-1]
  if sp.temperature != 1.0:
    x = x / jnp.float32(sp.temperature)
  sorted_desc = None
  if 0 < sp.top_k < vocab:
    top = jax.lax.top_k(x, sp.top_k)[0]  # [..., k], descending
    x = jnp.where(x >= top[..., -1:], x, -jnp.inf)
    sorted_desc = top
  if sp.top_p < 1.0:
    if sorted_desc is None:
      sorted_desc = -jnp.sort(-x, axis=-1)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < jnp.float32(sp.top_p)  # a prefix; always keeps the first
    threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    x = jnp.where(x >= threshold, x, -jnp.inf)
  if sp.min_p > 0.0:
    top1 = jnp.max(x, axis=-1, keepdims=True)
    x = jnp.where(x >= top1 + jnp.log(jnp.float32(sp.min_p)), x, -jnp.inf)
  return x


def _is_identity(sp: SamplingParams, vocab: int) -> bool:
  return (sp.temperature == 1.0 and not 0 < sp.top_k < vocab and sp.top_p >= 1.0
          and sp.min_p == 0.0)


def _argmax(x):
  """``jnp.argmax`` over the last axis (first index of the maximum), as max + min-index: two
  plain reductions, several times faster on XLA:CPU than the variadic argmax reduce."""
  vocab = x.shape[-1]
  top = jnp.max(x, axis=-1, keepdims=True)
  idx = jnp.min(jnp.where(x == top, jax.lax.iota(jnp.int32, vocab), vocab), axis=-1)
  return jnp.minimum(idx, vocab - 1)


def _take(x, idx):
  return jnp.take_along_axis(x, idx[..., None], axis=-1)[..., 0]


def pick_tokens(logits: jax.Array, key: jax.Array, sp: SamplingParams, row_offset=0):
  """Sample one token per row. logits [B, V] -> (tokens [B] int32, sampler_logp [B],
  draw_logp [B]).

  ``sampler_logp`` is under ``log_softmax(logits)`` (the policy at temperature 1), ``draw_logp``
  under the processed distribution the token was drawn from (0 for greedy). ``key``: a
  ``jax.random`` key (or the uint32[2] words of a threefry key); the draw equals
  ``jax.random.categorical(key, processed_logits)``. ``row_offset``: index of the first row in
  the whole batch (a shard's rows draw what they would draw unsharded).
  """
  logits = logits.astype(jnp.float32)
  if sp.is_greedy:
    return _log_probs(logits, None, _argmax(logits), sp)
  x = process_logits(logits, sp)
  if noise.is_threefry(key):  # same draw as jax.random.categorical, without inner loops
    tokens = _argmax(x + noise.gumbel(key, x.shape, offset=row_offset * x.shape[-1]))
  else:  # other RNGs: no counter offset, so fold the first row's index into the key
    if not (isinstance(row_offset, int) and row_offset == 0):
      key = jax.random.fold_in(key, row_offset)
    tokens = jax.random.categorical(key, x, axis=-1).astype(jnp.int32)
  return _log_probs(logits, x, tokens, sp)


def pick_tokens_rows(logits: jax.Array, keys: jax.Array, rows: jax.Array, sp: SamplingParams):
  """``pick_tokens`` with a key per row: row ``i`` draws with ``keys[i]`` at the noise counters of
  batch row ``rows[i]``. logits [R, V]; keys: uint32 [R, 2] threefry key words (row ``i`` then
  draws exactly what ``pick_tokens(.., keys[i], sp)`` draws for batch row ``rows[i]``), or [R]
  typed keys of another RNG (row ``i`` draws ``categorical(fold_in(keys[i], rows[i]))``)."""
  logits = logits.astype(jnp.float32)
  if sp.is_greedy:
    return _log_probs(logits, None, _argmax(logits), sp)
  x = process_logits(logits, sp)
  if noise.is_threefry(keys):
    tokens = _argmax(x + noise.gumbel_rows(noise.key_data(keys), rows, x.shape[-1]))
  else:
    draw = lambda k, r, xi: jax.random.categorical(jax.random.fold_in(k, r), xi)
    tokens = jax.vmap(draw)(keys, rows, x).astype(jnp.int32)
  return _log_probs(logits, x, tokens, sp)


def _log_probs(logits, processed, tokens, sp: SamplingParams):
  """(tokens, policy log-prob, log-prob under the processed distribution) of drawn ``tokens``."""
  sampler_logp = _take(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)
  if processed is None:  # greedy: the processed distribution is a point mass
    return tokens, sampler_logp, jnp.zeros(tokens.shape, jnp.float32)
  if _is_identity(sp, logits.shape[-1]):  # the sampling distribution is the policy
    return tokens, sampler_logp, sampler_logp
  draw_logp = _take(processed, tokens) - jax.nn.logsumexp(processed, axis=-1)
  return tokens, sampler_logp, draw_logp

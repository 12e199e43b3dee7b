"""``Rollout``: the batch record that flows from the sampler to the update (re-exported by
``rljax.rollout.sampler`` and ``rljax.rollout``)."""
from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class Rollout:
  """One rollout batch, a pytree of arrays from the sampler to the update: ``B = Pn * G`` rows,
  groups contiguous. The sampler fills the first block; the host adds the rewards; scoring adds
  the log-probs, values and advantages. A field that does not apply stays None (never zeros), so
  shardings follow from the fields present.

  From the sampler:
    prompt_tokens: [B, P] int32, left-padded prompts (each repeated ``G`` times).
    prompt_mask: [B, P] int32, 1 on real prompt tokens.
    tokens: [B, T] int32, completion tokens, ``pad_id`` after the stop token.
    mask: [B, T] int32, 1 on completion tokens including the stop token, 0 on padding.
    sampler_logp: [B, T] float32, log-prob of each token under the policy (raw, temperature-1
      logits) as the sampler computed it (in ``dtype``); 0 on padding. Use this one for
      importance ratios against the trainer's log-probs.
    draw_logp: [B, T] float32, log-prob under the processed distribution actually sampled
      from (temperature / top-k / top-p / min-p); 0 for greedy and on padding.
    lengths: [B] int32, ``sum(mask, -1)``.
    truncated: [B] bool, True exactly for rows that emitted no stop token within ``T``.
  From the host (``rljax.train.loop``):
    rewards: [B] float32, shaped outcome rewards ``R_i``.
    correct: [B] bool, the verifier's verdict.
    row_valid: [B] float32, 0 on rows that only pad the batch to its shape (dynamic sampling).
  From scoring (``rljax.train.step.score``):
    loss_mask: [B, T] float32, the tokens the losses see (mask x row_valid, after the overlong
      filter).
    old_logp: [B, T] policy log-probs before the update; None when the loss's own forward
      gives them (one optimizer update per batch).
    ref_logp: [B, T] reference log-probs; None without a reference model.
    values, returns: [B, T] critic values and targets; None without a critic.
    advantages: [B, T].
    positive: [B] float32, VAPO's positive examples.
  Of the section 8 transforms (ALGORITHMS.md 8.2-8.8), None while a transform is off:
    remax_baseline: [B] float32, the reward of the greedy completion of the row's prompt (host).
    is_weight: [B, T] rollout IS weights sampler -> old, multiplying the policy term only (score).
    old_entropy: [B, T] ``H_old``, the full-vocabulary entropy of the scoring forward (score).
    teacher_logp: [B, T] the teacher's log-probs of the sampled tokens (score).
    cov_sel: [B, T] 0/1 Clip-Cov / KL-Cov selection (per optimizer minibatch).
    entropy_keep: [B, T] 0/1 80/20 keep mask (per optimizer minibatch).
  """
  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  tokens: jax.Array
  mask: jax.Array
  sampler_logp: jax.Array
  draw_logp: jax.Array
  lengths: jax.Array
  truncated: jax.Array
  rewards: Any = None
  correct: Any = None
  row_valid: Any = None
  loss_mask: Any = None
  old_logp: Any = None
  ref_logp: Any = None
  values: Any = None
  returns: Any = None
  advantages: Any = None
  positive: Any = None
  remax_baseline: Any = None
  is_weight: Any = None
  old_entropy: Any = None
  teacher_logp: Any = None
  cov_sel: Any = None
  entropy_keep: Any = None

  @property
  def num_rows(self) -> int:
    return self.tokens.shape[0]

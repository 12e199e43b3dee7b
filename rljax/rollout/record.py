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
  From scoring (``rljax.learner.step.score``):
    loss_mask: [B, T] float32, the tokens the losses see (mask x row_valid, after the overlong
      filter).
    old_logp: [B, T] policy log-probs before the update; None when the loss's own forward
      gives them (one optimizer update per batch); ``sampler_logp`` with
      ``algo.old_logp='sampler'``.
    ref_logp: [B, T] reference log-probs; None without a reference model.
    values, returns: [B, T] critic values and targets; None without a critic.
    advantages: [B, T].
    positive: [B] float32, VAPO's positive examples.
  From the transforms (``rljax.transforms``), one mapping whatever they are: ``extras``, ``{name:
    [B, ...] array}``, e.g. ReMax's ``remax_baseline`` [B] (host), rollout correction's
    ``is_weight`` [B, T] and the 80/20 mask's ``old_entropy`` [B, T] (score), Clip-Cov's
    ``cov_sel`` and the 80/20 ``entropy_keep`` [B, T] (per optimizer minibatch). Rows first, so
    they are sharded like every other field; the losses read them by name.
  Multi-turn rollouts (``rljax.envs.episodes``, ``env.name`` set) fill the same record: ``tokens``
    are everything after the first prompt, the policy's turns *and* the environment's
    observations; ``mask`` (and ``sampler_logp`` / ``draw_logp``) cover policy tokens only; their
    ``extras`` add ``source`` [B, T] int32, who wrote each position (0 padding, 1 policy, 2
    environment: ``rljax.learner.step.sequence_inputs`` attends to every non-zero one), and per
    row ``env_turns``, ``env_tool_calls``, ``env_tool_errors`` [B] int32.
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
  extras: Any = struct.field(default_factory=dict)

  @property
  def num_rows(self) -> int:
    return self.tokens.shape[0]

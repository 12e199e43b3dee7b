"""The record the trainer passes around: the sampler's ``Rollout`` plus the fields of the
section 8 transforms (ALGORITHMS.md 8.2-8.8). Like every ``Rollout`` field, one that does not
apply stays None (never zeros), so shardings and compiled structures follow from what is on.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from flax import struct

from rljax.rollout.sampler import Rollout


@struct.dataclass
class TrainBatch(Rollout):
  """A ``Rollout`` with the transforms' fields.

  From the host (``rljax.train.loop``):
    remax_baseline: [B] float32, the reward of the greedy completion of the row's prompt (8.8).
  From scoring (``rljax.train.step.score``), once per rollout batch:
    is_weight: [B, T] rollout IS weights sampler -> old (8.2), multiplying the policy term only.
    old_entropy: [B, T] ``H_old``, the full-vocabulary entropy of the scoring forward (8.4).
    teacher_logp: [B, T] the teacher's log-probs of the sampled tokens (8.6).
  Per optimizer minibatch (``rljax.train.step.minibatch_update``), before its first forward:
    cov_sel: [B, T] 0/1 Clip-Cov / KL-Cov selection (8.3).
    entropy_keep: [B, T] 0/1 80/20 keep mask (8.4).
  """
  remax_baseline: Any = None
  is_weight: Any = None
  old_entropy: Any = None
  teacher_logp: Any = None
  cov_sel: Any = None
  entropy_keep: Any = None


def as_train_batch(rollout: Rollout) -> TrainBatch:
  """The same record as a ``TrainBatch`` (the new fields None unless it is one already)."""
  if isinstance(rollout, TrainBatch):
    return rollout
  return TrainBatch(**{f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)})

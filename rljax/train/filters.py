"""Batch construction on the host: group filters (DAPO dynamic sampling) and stacking of rounds.

docs/algorithms.md section 7. Rows are groups of G contiguous completions of one prompt; a filter
decides per group. Arrays here are NumPy: filtering decisions are data-dependent shapes, which is
exactly what cannot live inside the compiled step.
"""
from __future__ import annotations

import jax
import numpy as np

from rljax.rollout.sampler import Rollout


def group_keep_mask(correct: np.ndarray, rewards: np.ndarray, group_size: int,
                    keep_pass_rate: tuple | None = None) -> np.ndarray:
  """Which groups to keep, [P] bool (DAPO arXiv 2503.14476; Bae et al. arXiv 2504.03380).

  Default: ``0 < #correct < G`` and a non-zero reward spread, the groups that carry a gradient
  under a group baseline. With ``keep_pass_rate=(lo, hi)``: ``lo <= #correct / G <= hi``
  (online difficulty filtering), still requiring a reward spread.
  """
  correct = np.asarray(correct, np.float64).reshape(-1, group_size)
  rewards = np.asarray(rewards, np.float64).reshape(-1, group_size)
  spread = rewards.max(axis=1) > rewards.min(axis=1)
  pass_rate = correct.mean(axis=1)
  if keep_pass_rate is None:
    return spread & (pass_rate > 0) & (pass_rate < 1)
  lo, hi = keep_pass_rate
  return spread & (pass_rate >= lo) & (pass_rate <= hi)


def take_groups(rollout: Rollout, groups: np.ndarray, group_size: int) -> Rollout:
  """The rows of ``groups`` (indices of groups of ``group_size`` contiguous rows), every field."""
  rows = (np.asarray(groups)[:, None] * group_size + np.arange(group_size)).reshape(-1)
  return jax.tree.map(lambda x: x[rows], rollout)


def _left_pad_to(x: np.ndarray, width: int) -> np.ndarray:
  return np.pad(x, ((0, 0), (width - x.shape[1], 0)))


def concat_groups(parts: list[Rollout]) -> Rollout:
  """Stack rounds; prompts are re-left-padded to the widest round's (bucketed) width."""
  width = max(p.prompt_tokens.shape[1] for p in parts)
  parts = [p.replace(prompt_tokens=_left_pad_to(p.prompt_tokens, width),
                     prompt_mask=_left_pad_to(p.prompt_mask, width)) for p in parts]
  return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def pad_groups(part: Rollout, num_groups: int, group_size: int) -> Rollout:
  """Fill up to ``num_groups`` with invalid copies of the first group (``row_valid = 0``).

  Keeps the train_step's shapes fixed when dynamic sampling hits ``max_gen_batches``: the padded
  rows have zero mask in every loss and count, so they change nothing but the shape.
  """
  have = part.num_rows // group_size
  if have >= num_groups:
    return take_groups(part, np.arange(num_groups), group_size)
  filler = take_groups(part, np.zeros(num_groups - have, np.int64), group_size)
  filler = filler.replace(row_valid=np.zeros_like(filler.row_valid))
  return concat_groups([part, filler])

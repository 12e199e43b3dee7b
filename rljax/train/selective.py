"""Selective rollouts (GRESO, Zheng et al. arXiv 2506.02177): prompts whose recent groups carried
no gradient are skipped before they are sampled, not after.

Under a group baseline a group of all-correct or all-wrong completions has zero advantage, and
a prompt that gave one such group tends to give another. ``SelectiveSource`` wraps the run's
``PromptSource``, keeps each prompt's run of such groups and skips a drawn prompt with a
probability that grows with that run (``skip_probability``); after each RL step the exploration
probabilities move toward a target share of zero-spread groups among the step's sampled groups
(``adapt_exploration``). Its state, the history included, is part of the source's
``state_dict()``, so a checkpoint records it with the data position and a resumed run draws
and skips the same prompts.

Where this differs from GRESO's code: a group counts as all correct / all wrong when its pass
rate is exactly 1 / 0 (GRESO thresholds the mean reward at 0.98 / 0.11, the same thing for
G <= 8), and the controller moves from the first step (GRESO's from the dataset's second epoch;
a generated stream has no epochs). GRESO's adaptive rollout batch size is not taken: a round
samples ``rollout.prompts_per_step`` prompts, as without it.
"""
from __future__ import annotations

import hashlib

import numpy as np

from rljax.data.datasets import PromptSource

# GRESO's constants: the exploration probabilities stay in [0.05, 0.95] and move by 0.01 a step;
# a prompt is kept with probability at least 0.01 however long its run; a third of the target
# share goes to all-correct groups, two thirds to all-wrong ones (hard prompts are the likelier
# to change as the policy improves).
EXPLORE_RANGE = (0.05, 0.95)
EXPLORE_STEP = 0.01
MIN_KEEP = 0.01
EASY_SHARE = 1 / 3
EASY, HARD = "easy", "hard"  # all correct / all wrong


def skip_probability(explore: float, run_length: int) -> float:
  """``1 - max(p ** z, 0.01)``: the chance of skipping a prompt whose last ``z`` groups in a row
  were all correct (or all wrong), ``p`` the exploration probability of that kind (GRESO, the
  probabilistic filter); 0 for ``z = 0``."""
  if run_length <= 0:
    return 0.0
  return 1.0 - max(explore ** run_length, MIN_KEEP)


def adapt_exploration(explore: float, share: float, target: float) -> float:
  """One step of GRESO's controller: ``p - 0.01`` if the step's share of zero-spread groups of
  this kind reached its target (skip more), else ``p + 0.01``, clipped to [0.05, 0.95]."""
  lo, hi = EXPLORE_RANGE
  moved = explore - EXPLORE_STEP if share >= target else explore + EXPLORE_STEP
  return float(min(max(moved, lo), hi))


def zero_spread_kinds(correct: np.ndarray, group_size: int) -> list:
  """Per group of ``group_size`` contiguous rows: ``'easy'`` (all correct), ``'hard'`` (none)
  or None (a spread)."""
  rate = np.asarray(correct, np.float64).reshape(-1, group_size).mean(axis=1)
  return [EASY if r == 1 else HARD if r == 0 else None for r in rate]


def _uniform(seed: int, position: int) -> float:
  """A uniform draw in [0, 1) fixed by ``(seed, position)``: a hash, ~10x cheaper than seeding a
  generator, since a run may skip hundreds of thousands of drawn prompts."""
  digest = hashlib.blake2b(f"{seed}/{position}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


def _step_counts() -> dict:
  """A step's counts: prompts skipped, groups sampled, and those all correct / all wrong."""
  return {"skipped": 0, "groups": 0, EASY: 0, HARD: 0}


class SelectiveSource:
  """A ``PromptSource`` that skips prompts by their history (``algo.selective_rollout``).

  ``observe(problems, correct)`` after every sampled round records each prompt's run of
  all-correct or all-wrong groups (a group with a spread ends it); ``end_step()`` once per RL
  step adapts the exploration probabilities and returns the step's metrics. A skip is drawn
  from ``(train_seed, position)``, so it is the same on every process and after a resume.
  Everything else (the eval set, the counts of dropped rows) is the wrapped source's.
  """

  def __init__(self, source: PromptSource, *, group_size: int, target: float, explore: float):
    self._source, self.group_size = source, group_size
    self.target = {EASY: target * EASY_SHARE, HARD: target * (1 - EASY_SHARE)}
    self.explore = {EASY: float(explore), HARD: float(explore)}
    self.history: dict[str, tuple[str, int]] = {}  # prompt -> (kind, groups in a row)
    self._step = _step_counts()

  def __getattr__(self, name):  # eval_set, dropped_prompts, invalid_rows, position, ...
    if name.startswith("_"):  # before __init__ ran (a copy): not the wrapped source's
      raise AttributeError(name)
    return getattr(self._source, name)

  def next_batch(self, n: int) -> list:
    batch = []
    while len(batch) < n:
      position = self._source.position
      problem = self._source.next_batch(1)[0]
      if self._skips(problem.prompt, position):
        self._step["skipped"] += 1
      else:
        batch.append(problem)
    return batch

  def _skips(self, prompt: str, position: int) -> bool:
    kind, run_length = self.history.get(prompt, (None, 0))
    if not run_length:
      return False
    return _uniform(self._source.train_seed, position) < skip_probability(
        self.explore[kind], run_length)

  def observe(self, problems, correct) -> None:
    for problem, kind in zip(problems, zero_spread_kinds(correct, self.group_size)):
      self._step["groups"] += 1
      if kind is None:
        self.history.pop(problem.prompt, None)
        continue
      self._step[kind] += 1
      last, run_length = self.history.get(problem.prompt, (kind, 0))
      self.history[problem.prompt] = (kind, run_length + 1 if last == kind else 1)

  def end_step(self) -> dict:
    counts, groups = self._step, max(self._step["groups"], 1)
    metrics = {"selective/skipped_prompts": float(counts["skipped"])}
    for kind in (EASY, HARD):
      share = counts[kind] / groups
      metrics[f"selective/{kind}_frac"] = share
      self.explore[kind] = adapt_exploration(self.explore[kind], share, self.target[kind])
      metrics[f"selective/p_{kind}"] = self.explore[kind]
    self._step = _step_counts()
    return metrics

  def state_dict(self) -> dict:
    history = {prompt: [kind, n] for prompt, (kind, n) in self.history.items()}
    return {**self._source.state_dict(),
            "selective": {"explore": dict(self.explore), "history": history}}

  def load_state_dict(self, state: dict) -> None:
    """The wrapped source's position, and the history and exploration probabilities saved with
    it; a state saved without selective rollouts starts an empty history."""
    self._source.load_state_dict(state)
    saved = state.get("selective", {"explore": self.explore, "history": {}})
    self.explore = {kind: float(p) for kind, p in saved["explore"].items()}
    self.history = {prompt: (kind, int(n)) for prompt, (kind, n) in saved["history"].items()}


def selective_source(source: PromptSource, config):
  """``source`` itself, or wrapped in a ``SelectiveSource`` when ``algo.selective_rollout``."""
  if not config.algo.selective_rollout:
    return source
  return SelectiveSource(source, group_size=config.rollout.group_size,
                         target=config.algo.skip_target, explore=config.algo.skip_explore)

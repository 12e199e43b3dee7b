"""Environment failures explained: one line per batch, a sample in the run dir, and a stop when the
environment cannot work at all.

A failed ``reset`` or ``step`` (an exception, a hang past ``env.timeout_s``, a result that
``rljax.envs.validate`` refuses) costs its trajectory: reward 0, counted in ``env/errors`` /
``env/timeouts``. ``FailureReport`` is what the rollout calls with every batch of episodes:

- a batch with failures logs one line, ``N of B episodes of environment 'x' failed (...); first:
  <why>``, as the verifiers do for reward calls;
- a bounded sample of them (``reward.max_logged_failures`` over the run) goes to
  ``env_failures.jsonl`` in the run dir, each with its text, the turn it failed at and the
  transcript so far;
- when every episode of the first batch fails, the environment is broken, not unlucky (a bug in
  ``reset``, a class the worker processes cannot import): the run stops with
  ``EnvironmentBrokenError``, one line naming the environment and the first error, instead of
  training on rewards that are all 0.
"""
from __future__ import annotations

import logging
from typing import Optional

from rljax.errors import RljaxError
from rljax.rewards.checkers import FailureLog


class EnvironmentBrokenError(RljaxError, RuntimeError):
  """Every episode of the first batch failed: the environment cannot run."""


def _first_line(text) -> str:
  lines = str(text or "").strip().splitlines()
  return lines[0][:300] if lines else "(no message)"


def summary(env_name: str, failures, episodes: int) -> str:
  """``'N of B episodes of environment 'x' failed (k errors, m timeouts); first: <why>'``."""
  kinds = {}
  for f in failures:
    kinds[f["outcome"]] = kinds.get(f["outcome"], 0) + 1
  counted = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in sorted(kinds.items()))
  return (f"{len(failures)} of {episodes} episodes of environment {env_name!r} failed "
          f"({counted}); first: {_first_line(failures[0]['detail'])}")


class FailureReport:
  """Called with every ``MultiTurnResult`` of a run (module docstring). ``log_path``: the run
  dir's ``env_failures.jsonl`` (None: no file); ``limit``: records written over the run."""

  def __init__(self, env_name: str, log_path: Optional[str] = None, limit: int = 100,
               warn=logging.warning):
    self.env_name = env_name
    self.log = None if log_path is None else FailureLog(log_path, limit)
    self.warn = warn
    self.batches = 0

  def __call__(self, result) -> None:
    failures = result.failures
    first = self.batches == 0
    self.batches += 1
    if not failures:
      return
    n = len(result.episodes)
    if self.log is not None:
      self.log.append([dict(f, environment=self.env_name) for f in failures])
    if not (first and len(failures) == n):
      self.warn(summary(self.env_name, failures, n))
    else:  # the one line is the error's
      raise EnvironmentBrokenError(
          f"environment {self.env_name!r}: every episode of the first batch failed ({n}); "
          f"first: {_first_line(failures[0]['detail'])}")

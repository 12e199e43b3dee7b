"""Environment calls in the verifiers' killable worker processes (``rljax.rewards.isolation``).

Every ``reset`` and ``step`` runs in a worker process with a hard deadline (``env.timeout_s``):
the environment object travels to the worker pickled with the call and comes back pickled with
its answer, so its state survives whichever worker serves the next turn. A call that runs past
its deadline (its worker is killed and replaced), raises, kills its process or returns something
that is not a ``StepResult`` ends that trajectory: the driver scores it 0 and counts it
(``env/timeouts``, ``env/errors``). Only plain data comes back besides the environment object:
the observation as text or a list of ints, the reward as a finite float, ``info`` as plain values.

The pool is separate from the verifiers' (``isolation.shared_pool`` keeps one pool per function),
sized by ``reward.workers`` with the same memory and recycling limits.
"""
from __future__ import annotations

import atexit
import dataclasses
import math
from typing import Any, List, Sequence

import numpy as np

from rljax.envs.base import Environment, StepResult, plain
from rljax.rewards import isolation


@dataclasses.dataclass(frozen=True)
class EnvOutcome:
  """One isolated call: ``status`` 'ok' (``env`` the environment after the call, ``value`` the
  first observation of a reset or ``(observation, reward, done, info)`` of a step), 'error'
  (``value`` says why) or 'timeout'."""
  status: str
  env: Any = None
  value: Any = None


def _observation(value):
  if isinstance(value, str):
    return value
  if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool)
                                              for v in value):
    return [int(v) for v in value]
  if isinstance(value, np.ndarray) and value.ndim == 1 and np.issubdtype(value.dtype, np.integer):
    return [int(v) for v in value]
  raise TypeError(f"an observation must be text or a list of token ids, got "
                  f"{type(value).__name__}")


def _env_call(op: str, env: Environment, arg):
  """What a worker runs: ``(env, first observation)`` of a reset, ``(env, (observation, reward,
  done, info))`` of a step, checked here so that only plain data reaches the trainer."""
  if op == "reset":
    return env, _observation(env.reset(arg))
  result = env.step(arg)
  if not isinstance(result, StepResult):
    try:
      result = StepResult(*result)
    except TypeError:
      raise TypeError(f"step returned {type(result).__name__}, not a StepResult or "
                      "(observation, reward, done, info)") from None
  reward = float(result.reward)
  if not math.isfinite(reward):
    raise ValueError(f"step returned the reward {reward}")
  done = bool(result.done)
  observation = "" if done else _observation(result.observation)
  info = plain(result.info if isinstance(result.info, dict) else {})
  return env, (observation, reward, done, info)


_POOL: isolation.VerifierPool | None = None


def env_pool(workers: int, max_worker_memory_mb: int = 0,
             worker_max_calls: int = 0) -> isolation.VerifierPool:
  """The process-wide environment pool for these settings (forked once, reused across turns and
  steps; other settings replace it)."""
  global _POOL
  settings = (_env_call, workers, max_worker_memory_mb, worker_max_calls)
  if _POOL is None or _POOL.settings != settings:
    if _POOL is not None:
      _POOL.close()
    else:
      atexit.register(close_env_pool)
    _POOL = isolation.VerifierPool(*settings)
  return _POOL


def close_env_pool() -> None:
  """Kill the environment workers (at exit; tests that need freshly forked workers)."""
  global _POOL
  if _POOL is not None:
    _POOL.close()
    _POOL = None


@dataclasses.dataclass(frozen=True)
class EnvRunner:
  """Runs ``reset`` / ``step`` batches in the worker pool with a per-call deadline."""
  timeout_s: float = 5.0
  workers: int = 4
  max_worker_memory_mb: int = 0
  worker_max_calls: int = 0

  @property
  def pool(self) -> isolation.VerifierPool:
    return env_pool(self.workers, self.max_worker_memory_mb, self.worker_max_calls)

  def _map(self, calls: Sequence[tuple]) -> List[EnvOutcome]:
    if not calls:
      return []
    return [_env_outcome(o) for o in self.pool.map(list(calls), timeout_s=self.timeout_s)]

  def reset(self, envs: Sequence[Environment], problems: Sequence) -> List[EnvOutcome]:
    return self._map([("reset", env, problem) for env, problem in zip(envs, problems)])

  def step(self, envs: Sequence[Environment], actions: Sequence[str]) -> List[EnvOutcome]:
    return self._map([("step", env, action) for env, action in zip(envs, actions)])

  # Asynchronous steps (the continuous multi-turn engine): submitted one by one as turns end,
  # collected as they finish while the sampler keeps decoding other rows.

  def submit_step(self, tag, env: Environment, action: str) -> None:
    """Start ``env.step(action)`` in a worker; ``poll`` returns its outcome with ``tag``."""
    self.pool.submit(tag, ("step", env, action), timeout_s=self.timeout_s)

  def poll(self, wait_s: float = 0.0) -> List[tuple]:
    """``(tag, EnvOutcome)`` of the steps that finished, waiting up to ``wait_s`` for one."""
    return [(tag, _env_outcome(o)) for tag, o in self.pool.poll(wait_s)]

  @property
  def in_flight(self) -> int:
    return self.pool.in_flight


def _env_outcome(outcome: isolation.Outcome) -> EnvOutcome:
  """A worker's answer as an ``EnvOutcome``: ``(env, value)`` or why there is none."""
  if outcome.status != "ok":
    return EnvOutcome(outcome.status, value=outcome.value)
  try:
    env, value = outcome.value
  except (TypeError, ValueError):
    return EnvOutcome("error", value="malformed answer from the environment process")
  return EnvOutcome("ok", env, value)


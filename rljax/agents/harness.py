"""Agent harnesses: the code that plays an episode against the endpoint (``env.engine=
'endpoint'``, ``rljax.agents.driver``), registered by name and chosen by ``env.name``.

A harness is ordinary agent code: a function of an ``AgentTask`` (the episode's ``base_url``,
``api_key`` and ``model`` for an OpenAI client, and its ``problem``) that talks to the endpoint
as to any OpenAI-compatible server and returns the episode's result::

  @register_harness("calc_agent")
  def calc_agent(task):
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key)
    ...                                   # an agent loop of chat or completions calls
    return task.score("exact_match", final_text)   # or a number, or a dict (``Result``)

What it returns is its reward: a number, a bool, or ``{"reward": r, "correct": c, "info":
{...}}``; ``task.score(fn, text)`` checks ``text`` with a registered reward function
(``reward.fn``'s registry, e.g. ``exact_match``, ``code_tests``) and returns that result, so a
verifier can give the reward. A subprocess harness (an agent CLI, another language) is
``command_harness(argv)``: the program runs with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` /
``OPENAI_MODEL`` in its environment and the problem as JSON on stdin, and prints its result as
JSON on its last line of stdout. A harness function may carry ``prepare()`` and ``close()``
(e.g. starting and stopping an environment server, ``rljax.agents.openenv_agent``): the engine
calls them before its workers fork and when it closes.

Every episode's harness runs in a worker process of its own pool (``rljax.rewards.isolation``:
killable, its own process group, ``reward.max_worker_memory_mb``), at most ``env.harness_workers``
at once, within ``env.timeout_s`` for the whole episode: a harness that raises, hangs, dies or
returns something else than a result fails its episode (reward 0, counted and explained), never
the run. A registered harness is also an ``Environment`` of the registry (``env.name``) that
only the endpoint driver runs (``Environment.stepped`` False).
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import math
import os
import subprocess
from typing import Callable, Dict, Optional, Sequence

from rljax.data.tasks import Problem
from rljax.envs.base import Environment, plain, register_env
from rljax.errors import RljaxError
from rljax.rewards import isolation
from rljax.rewards.checkers import get_reward_fn, reward_spec

ENDPOINT_ENGINE = "endpoint"
HARNESSES: Dict[str, Callable] = {}


class HarnessResultError(RljaxError, ValueError):
  """A harness returned something that is not a result."""


@dataclasses.dataclass(frozen=True)
class AgentTask:
  """What a harness is given for one episode."""
  base_url: str  # ``http://127.0.0.1:PORT/e/EPISODE/v1``: the episode's own endpoint
  api_key: str
  model: str
  problem: Problem

  def score(self, fn: str, text: str) -> dict:
    """``{"reward", "correct"}`` of ``text`` checked against the problem by the registered
    reward function ``fn`` (its declared range; correct at full credit)."""
    value, why = reward_spec(fn).check(get_reward_fn(fn)(text, self.problem))
    if why is not None:
      raise HarnessResultError(f"reward function {fn!r} {why}")
    return {"reward": value, "correct": value >= reward_spec(fn).high}


@dataclasses.dataclass(frozen=True)
class Result:
  """A harness's result as the driver reads it."""
  reward: float
  correct: bool = False
  info: dict = dataclasses.field(default_factory=dict)


def as_result(value) -> Result:
  """A harness's return value (module docstring) as a ``Result``; anything else is refused."""
  if isinstance(value, dict):
    unknown = set(value) - {"reward", "correct", "info"}
    if unknown or "reward" not in value:
      raise HarnessResultError(f"a harness result dict holds 'reward' (and optionally 'correct', "
                               f"'info'); got keys {sorted(value)}")
    correct, info = value.get("correct", False), value.get("info") or {}
    if not isinstance(correct, bool) or not isinstance(info, dict):
      raise HarnessResultError("a harness result's 'correct' is a bool and 'info' a dict")
    return Result(_reward(value["reward"]), correct, plain(info))
  if isinstance(value, bool):
    return Result(float(value), value)
  return Result(_reward(value))


def _reward(value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise HarnessResultError(f"a harness returned {type(value).__name__} {repr(value)[:80]}, "
                             "not a reward (a number, a bool or a dict with 'reward')")
  value = float(value)
  if not math.isfinite(value) or abs(value) > 3.4e38:
    raise HarnessResultError(f"a harness returned the reward {value}, not finite in float32")
  return value


class AgentHarnessEnv(Environment):
  """The registry entry of a harness: an environment that only ``env.engine='endpoint'`` runs
  (its episodes are played by the harness, not stepped)."""

  stepped = False
  harness: Callable = None

  def reset(self, problem):
    raise RljaxError(f"environment {self.name!r} is an agent harness: run it with "
                     f"env.engine='{ENDPOINT_ENGINE}'")

  def step(self, action):
    raise RljaxError(f"environment {self.name!r} is an agent harness: run it with "
                     f"env.engine='{ENDPOINT_ENGINE}'")


def register_harness(name: str):
  """Decorator registering ``fn(task: AgentTask) -> result`` as the harness ``name``
  (``env.name``)."""
  def add(fn):
    cls = type(f"Harness_{name}", (AgentHarnessEnv,), {"harness": staticmethod(fn),
                                                       "__module__": fn.__module__})
    register_env(name)(cls)
    HARNESSES[name] = fn
    return fn
  return add


def harness_of(name: str) -> Callable:
  if name not in HARNESSES:
    raise RljaxError(f"env.name={name!r} is not an agent harness; registered harnesses: "
                     f"{', '.join(sorted(HARNESSES)) or '(none)'}")
  return HARNESSES[name]


def command_harness(argv: Sequence[str], *, timeout_s: Optional[float] = None,
                    env: Optional[dict] = None) -> Callable:
  """A harness that runs the program ``argv`` per episode (module docstring). Its result is the
  JSON on the last line of its stdout; ``timeout_s`` bounds it within the episode's own."""
  argv = list(argv)

  def run(task: AgentTask):
    variables = dict(os.environ, **(env or {}), OPENAI_BASE_URL=task.base_url,
                     OPENAI_API_KEY=task.api_key, OPENAI_MODEL=task.model)
    problem = {"prompt": task.problem.prompt, "answer": task.problem.answer,
               "meta": plain(task.problem.meta)}
    done = subprocess.run(argv, input=json.dumps(problem), capture_output=True, text=True,
                          env=variables, timeout=timeout_s)
    if done.returncode != 0:
      tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
      raise RuntimeError(f"harness program {argv[0]!r} exited {done.returncode}: {tail}")
    lines = done.stdout.strip().splitlines()
    try:
      return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
      raise HarnessResultError(f"harness program {argv[0]!r} printed no JSON result on its last "
                               "line") from None
  return run


def _run_harness(name: str, task: AgentTask) -> Result:
  """What a worker runs for one episode."""
  return as_result(harness_of(name)(task))


_POOL: Optional[isolation.VerifierPool] = None


def harness_pool(workers: int, max_worker_memory_mb: int = 0) -> isolation.VerifierPool:
  """The process-wide pool of harness workers for these settings (forked once, reused)."""
  global _POOL
  settings = (_run_harness, workers, max_worker_memory_mb, 0)
  # Workers are forked with the harnesses registered then: a new registration forks new ones.
  if _POOL is None or _POOL.settings != settings or _POOL.harnesses != tuple(HARNESSES):
    if _POOL is not None:
      _POOL.close()
    else:
      atexit.register(close_harness_pool)
    _POOL = isolation.VerifierPool(*settings)
    _POOL.harnesses = tuple(HARNESSES)
  return _POOL


def close_harness_pool() -> None:
  global _POOL
  if _POOL is not None:
    _POOL.close()
    _POOL = None


def outcome_result(outcome: isolation.Outcome) -> tuple[Optional[Result], str, str]:
  """``(result, 'done' | 'error' | 'timeout', why)`` of a worker's answer."""
  if outcome.status == "ok" and isinstance(outcome.value, Result):
    return outcome.value, "done", ""
  if outcome.status == "timeout":
    return None, "timeout", ""
  return None, "error", str(outcome.value or "the harness process gave no result")


"""Verifiable outcome rewards (ALGORITHMS.md section 1, ``reward.fn``) and their safe execution.

A reward function maps ``(completion, problem) -> float`` (1.0 correct, 0.0 wrong), where the
completion is the decoded text the model produced after the prompt. ``score_completions`` runs
one over a batch in a pool of daemon threads with a per-call timeout, so a verifier that hangs or
raises costs one wrong answer (counted), never the training loop.

Final answers are read, in order of preference, from the last ``\\boxed{...}``, else from what
follows the last ``#`` marker (which covers GSM8K's ``#### 72`` and the embedded tasks' ``#72``).
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Callable, Sequence

import numpy as np

from rljax.data.tasks import MARKER, Problem, make_task, marked_answer

RewardFn = Callable[[str, Problem], float]


class RewardRegistry(dict):
  """``name -> reward function``, listed by ``names()`` like the algorithm registries."""

  def names(self) -> list[str]:
    return sorted(self)


REWARD_FNS = RewardRegistry()


class _DropDisabledTimeoutWarning(logging.Filter):
  """math_verify warns that its signal timeout is off; ``run_with_timeouts`` replaces it."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Timeout is disabled")


for _logger in ("math_verify.parser", "math_verify.grader"):
  logging.getLogger(_logger).addFilter(_DropDisabledTimeoutWarning())


def register_reward(name: str):
  """Decorator adding a reward function to ``REWARD_FNS`` under ``name``."""
  def add(fn: RewardFn) -> RewardFn:
    if name in REWARD_FNS:
      raise ValueError(f"reward function {name!r} is already registered")
    REWARD_FNS[name] = fn
    return fn
  return add


def get_reward_fn(name: str) -> RewardFn:
  """The reward function registered as ``name`` (``reward.fn``)."""
  if name not in REWARD_FNS:
    raise ValueError(f"reward.fn={name!r} is not registered; available: {REWARD_FNS.names()}")
  return REWARD_FNS[name]


# --- answer extraction -------------------------------------------------------------------------

def last_boxed(text: str) -> str | None:
  """Content of the last ``\\boxed{...}`` (nested braces balanced); None if absent or unclosed."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  depth, i = 0, start + len("\\boxed")
  for j in range(i, len(text)):
    depth += {"{": 1, "}": -1}.get(text[j], 0)
    if depth == 0:
      return text[i + 1:j].strip()
  return None


def final_answer(completion: str) -> str | None:
  """The completion's final answer: last boxed content, else the text after the last marker."""
  boxed = last_boxed(completion)
  return boxed if boxed is not None else marked_answer(completion)


def _task_of(problem: Problem):
  """The embedded task that generated ``problem``, or None for dataset problems."""
  name = problem.meta.get("task")
  return None if name is None else make_task(name, problem.meta.get("difficulty", 1))


def _normalize(answer: str) -> str:
  """Whitespace-, ``$``- and thousands-separator-insensitive form of a short answer."""
  return "".join(answer.replace("$", "").replace(",", "").split())


# --- reward functions --------------------------------------------------------------------------

@register_reward("exact_match")
def exact_match(completion: str, problem: Problem) -> float:
  """The task's own verifier for embedded problems; else normalised string equality."""
  task = _task_of(problem)
  if task is not None:
    return task.verify(completion, problem)
  got, gold = final_answer(completion), final_answer(problem.answer) or problem.answer
  return float(got is not None and got != "" and _normalize(got) == _normalize(gold))


@register_reward("math_verify")
def math_verify_reward(completion: str, problem: Problem) -> float:
  """Mathematical equivalence (``math_verify``) of the final answer and the gold answer.

  ``"0.5"`` matches ``"\\frac{1}{2}"``; gold answers may carry GSM8K's ``"#### 72"``. Without a
  boxed answer or marker, math_verify's own extraction reads the whole completion.
  """
  import math_verify  # sympy-heavy import: only when this reward is used

  gold_text = _as_math(marked_answer(problem.answer) or problem.answer)
  if last_boxed(completion) is not None or MARKER not in completion:
    pred_text = completion
  else:
    pred_text = _as_math(marked_answer(completion))
  # Timeouts are ours (score_completions): math_verify's signal-based ones fail off the main thread.
  config = [math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig()]
  gold = math_verify.parse(gold_text, extraction_config=config, parsing_timeout=None)
  pred = math_verify.parse(pred_text, extraction_config=config, parsing_timeout=None)
  if not gold or not pred:
    return 0.0
  return float(math_verify.verify(gold, pred, timeout_seconds=None))


def _as_math(answer: str) -> str:
  """A bare answer wrapped in ``$...$``: math_verify's LaTeX extraction needs delimiters
  (``'x+1'`` alone parses to nothing)."""
  if "$" in answer or "\\boxed" in answer or not answer.strip():
    return answer
  return f"${answer.strip()}$"


def format_ok(completion: str, problem: Problem) -> bool:
  """Whether the completion has the expected shape, whatever its correctness.

  Embedded tasks check their own format (steps, ``" #answer"``); dataset problems need a final
  answer (boxed or after the marker).
  """
  task = _task_of(problem)
  if task is not None:
    return task.format_ok(completion)
  answer = final_answer(completion)
  return answer is not None and answer != ""


# --- batched, time-limited scoring -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Scores:
  """Rewards of a batch of completions.

  Unpacks as ``rewards, correct = score_completions(...)``; the counts and the per-row format
  flags are attributes.

  Attributes:
    rewards: [B] float32, ``1`` if correct else ``wrong_value``, plus ``format_weight`` if the
      completion is well formed.
    correct: [B] bool.
    formatted: [B] bool.
    num_timeouts: verifier calls cut off after ``timeout_s`` (scored wrong and unformatted).
    num_errors: verifier calls that raised (scored wrong and unformatted).
  """
  rewards: np.ndarray
  correct: np.ndarray
  formatted: np.ndarray
  num_timeouts: int
  num_errors: int

  def __iter__(self):
    return iter((self.rewards, self.correct))


def score_completions(
    fn: str | RewardFn,
    completions: Sequence[str],
    problems: Sequence[Problem],
    *,
    wrong_value: float = 0.0,
    format_weight: float = 0.0,
    timeout_s: float = 5.0,
    workers: int = 4,
) -> Scores:
  """Score ``completions[i]`` against ``problems[i]`` with the reward function ``fn``.

  Args:
    fn: a name in ``REWARD_FNS`` or a reward function.
    completions: [B] decoded completions (text after the prompt).
    problems: [B] the matching problems (repeat a problem G times for a group).
    wrong_value: reward of a wrong, timed-out or failed answer (``reward.wrong_value``).
    format_weight: weight of the format term (``reward.format_weight``).
    timeout_s: per-call limit (``reward.timeout_s``).
    workers: verifier threads (``reward.workers``).
  """
  if len(completions) != len(problems):
    raise ValueError(
        f"{len(completions)} completions but {len(problems)} problems; pass one problem per row")
  if workers < 1 or timeout_s <= 0:
    raise ValueError(f"reward.workers={workers} must be >= 1, reward.timeout_s={timeout_s} > 0")
  reward_fn = get_reward_fn(fn) if isinstance(fn, str) else fn

  def judge(completion: str, problem: Problem) -> tuple[bool, bool]:
    return reward_fn(completion, problem) > 0.5, format_ok(completion, problem)

  calls = [(lambda c=c, p=p: judge(c, p)) for c, p in zip(completions, problems)]
  outcomes = run_with_timeouts(calls, timeout_s=timeout_s, workers=workers)
  correct = np.array([o.status == "ok" and o.value[0] for o in outcomes], dtype=bool)
  formatted = np.array([o.status == "ok" and o.value[1] for o in outcomes], dtype=bool)
  rewards = np.where(correct, 1.0, wrong_value) + format_weight * formatted
  errors = [o.value for o in outcomes if o.status == "error"]
  if errors:  # one line per batch: a systematic verifier bug would otherwise flood the log
    logging.warning("%d of %d reward calls raised (scored wrong); first: %r",
                    len(errors), len(outcomes), errors[0])
  return Scores(
      rewards=rewards.astype(np.float32),
      correct=correct,
      formatted=formatted,
      num_timeouts=sum(o.status == "timeout" for o in outcomes),
      num_errors=len(errors),
  )


@dataclasses.dataclass(frozen=True)
class Outcome:
  """Result of one call: status 'ok' (value = return), 'error' (value = exception) or 'timeout'."""
  status: str
  value: object = None


def run_with_timeouts(calls: Sequence[Callable[[], object]], *, timeout_s: float,
                      workers: int) -> list[Outcome]:
  """Run ``calls`` on ``workers`` threads; a call running longer than ``timeout_s`` is abandoned.

  Python cannot kill a thread, so an abandoned call keeps its (daemon) thread and a fresh worker
  takes its place: a hung verifier never blocks the rest of the batch nor interpreter exit.
  """
  n = len(calls)
  outcomes: list[Outcome | None] = [None] * n
  started: list[float | None] = [None] * n
  jobs: queue.SimpleQueue[int] = queue.SimpleQueue()
  for i in range(n):
    jobs.put(i)
  done = threading.Condition()

  def worker():
    while True:
      try:
        i = jobs.get_nowait()
      except queue.Empty:
        return
      with done:
        started[i] = time.monotonic()
      try:
        outcome = Outcome("ok", calls[i]())
      except Exception as e:  # a verifier bug is one wrong answer, not a crashed run
        outcome = Outcome("error", e)
      with done:
        if outcomes[i] is None:  # None unless it was already declared timed out
          outcomes[i] = outcome
          done.notify_all()

  def start_worker():
    threading.Thread(target=worker, daemon=True, name="rljax-verifier").start()

  for _ in range(min(workers, n)):
    start_worker()
  with done:
    while any(o is None for o in outcomes):
      now = time.monotonic()
      running = [i for i in range(n) if outcomes[i] is None and started[i] is not None]
      for i in running:
        if now - started[i] >= timeout_s:
          outcomes[i] = Outcome("timeout")
          start_worker()  # replaces the thread stuck in call i
      deadlines = [started[i] + timeout_s for i in running if outcomes[i] is None]
      done.wait(timeout=max(min(deadlines, default=now + timeout_s) - now, 1e-3))
  return outcomes

"""Verifiable outcome rewards (docs/algorithms.md section 1, ``reward.fn``), safely executed.

A reward function maps ``(completion, problem) -> float``, where the completion is the decoded
text the model produced after the prompt. Each registered function declares what it returns:
binary (1.0 correct, 0.0 wrong; the default) or real-valued in a ``value_range``.
``score_completions`` runs one over a batch in killable worker processes with a hard per-call
timeout (``rljax.rewards.isolation``), so a verifier that hangs, holds the GIL, raises or returns
nonsense costs one failed answer (counted as a timeout, error or invalid value), never the run.

Final answers are read, in order of preference, from the last ``\\boxed{...}``, else from what
follows the last ``#`` marker (which covers GSM8K's ``#### 72`` and the embedded tasks' ``#72``).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import os
from typing import Callable, Sequence

import numpy as np

from rljax.data import reasoning_gym_tasks
from rljax.data.tasks import MARKER, Problem, make_task, marked_answer
from rljax.registries import REWARD_FNS
from rljax.rewards import isolation

RewardFn = Callable[[str, Problem], float]


class _DropDisabledTimeoutWarning(logging.Filter):
  """math_verify warns that its signal timeout is off; ``run_with_timeouts`` replaces it."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Timeout is disabled")


for _logger in ("math_verify.parser", "math_verify.grader"):
  logging.getLogger(_logger).addFilter(_DropDisabledTimeoutWarning())


@dataclasses.dataclass(frozen=True)
class RewardSpec:
  """What a reward function may return: ``binary`` (exactly 0 or 1; booleans count) or any real
  in ``[low, high]``, where ``high`` is full credit (the answer counts as correct)."""
  binary: bool = True
  low: float = 0.0
  high: float = 1.0
  preload: tuple[str, ...] = ()  # modules imported before the workers fork (not once per worker)

  def check(self, value) -> tuple[float | None, str | None]:
    """``(value as float, None)`` when ``value`` is allowed, else ``(None, why)``. A 0.3 from a
    binary verifier is refused, never rounded."""
    if isinstance(value, (bool, np.bool_)):
      value = float(value)
    if not isinstance(value, (int, float, np.integer, np.floating)):
      return None, f"returned {type(value).__name__} {_short_repr(value)}, not a number"
    try:
      value = float(value)
    except (OverflowError, ValueError, TypeError) as e:  # 10**400: no float holds it
      return None, f"returned {type(value).__name__} that no float can hold ({type(e).__name__})"
    if not math.isfinite(value):
      return None, f"returned {value}"
    if self.binary and value not in (0.0, 1.0):
      return None, f"returned {value!r} but is declared binary (0 or 1)"
    if not self.low <= value <= self.high:
      return None, f"returned {value!r} outside its declared range [{self.low}, {self.high}]"
    return value, None


def _short_repr(value) -> str:
  try:
    return repr(value)[:80]
  except BaseException:  # a user object whose __repr__ fails (or an int past repr's digit limit)
    return "<unprintable>"


BINARY = RewardSpec()


def register_reward(name: str, *, binary: bool = True, value_range: tuple[float, float] = (0., 1.),
                    preload: tuple[str, ...] = ()):
  """Decorator adding a reward function to ``REWARD_FNS`` (``rljax.registries``: filled by the
  modules of ``rljax.rewards``) under ``name``, its ``RewardSpec`` as ``meta(name)['spec']``.

  Args:
    binary: it returns exactly 0 or 1 (or a bool); anything else is counted invalid.
    value_range: ``(low, high)`` of a real-valued reward (``binary=False``); ``high`` is full
      credit. Values outside it are counted invalid.
    preload: modules the function imports (e.g. sympy-heavy ones), imported in the trainer before
      the worker processes fork, so that a fresh worker (also one replacing a killed one) does not
      spend its time budget importing them.
  """
  low, high = (float(v) for v in value_range)
  if not (math.isfinite(low) and math.isfinite(high) and low < high):
    raise ValueError(f"register_reward({name!r}): value_range={value_range} needs low < high")
  if binary and (low, high) != (0.0, 1.0):
    raise ValueError(f"register_reward({name!r}): a binary reward has value_range (0, 1); "
                     "pass binary=False for a real-valued one")

  return REWARD_FNS.register(name, spec=RewardSpec(binary=binary, low=low, high=high,
                                                   preload=tuple(preload)))


def reward_spec(fn: str | RewardFn) -> RewardSpec:
  """The declared output of a registered reward (by name or function); an unregistered function
  is taken as binary."""
  if isinstance(fn, str):
    return REWARD_FNS.meta(fn)["spec"]
  for name in REWARD_FNS.names():
    if REWARD_FNS.get(name) is fn:
      return REWARD_FNS.meta(name)["spec"]
  return BINARY


def get_reward_fn(name: str) -> RewardFn:
  """The reward function registered as ``name`` (``reward.fn``)."""
  return REWARD_FNS.get(name)


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


@register_reward("math_verify", preload=("math_verify",))
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


@register_reward("reasoning_gym", binary=False, preload=("reasoning_gym",))
def reasoning_gym_reward(completion: str, problem: Problem) -> float:
  """The reasoning-gym task's own ``score_answer`` of the completion's answer (the last
  ``<answer>...</answer>``, else the text after the last ``#``); for ``data.source=
  'reasoning_gym:...'`` (``rljax.data.reasoning_gym_tasks``). 1.0 is correct; some tasks give
  partial credit in [0, 1)."""
  return reasoning_gym_tasks.score_completion(completion, problem)


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
  if reasoning_gym_tasks.SOURCE_KIND in problem.meta:
    return reasoning_gym_tasks.format_ok(completion)
  answer = final_answer(completion)
  return answer is not None and answer != ""


# --- batched, isolated scoring --------------------------------------------------------------

FAILURE_LOG = "reward_failures.jsonl"  # in the run dir
OUTCOMES = ("timeouts", "errors", "invalid")


@dataclasses.dataclass(frozen=True)
class Scores:
  """Rewards of a batch of completions.

  Unpacks as ``rewards, correct = score_completions(...)``; the counts and the per-row format
  flags are attributes, ``metrics()`` gives the counts as step metrics.

  Attributes:
    rewards: [B] float32. Binary rewards: ``1`` if correct else ``wrong_value``; real-valued: the
      value. Plus ``format_weight`` if the completion is well formed. A failed call (timeout,
      error, invalid value) scores ``wrong_value``, unformatted.
    correct: [B] bool (a binary 1, or a real-valued reward at the top of its range).
    formatted: [B] bool.
    num_timeouts: calls cut off after ``timeout_s`` (their process was killed and replaced).
    num_errors: calls that raised (or whose process died).
    num_invalid: calls that returned NaN, None, a non-number or a value outside the declared range.
    failures: ``[{"outcome", "detail", "completion", "prompt"}]`` of every failed call.
  """
  rewards: np.ndarray
  correct: np.ndarray
  formatted: np.ndarray
  num_timeouts: int
  num_errors: int
  num_invalid: int = 0
  failures: tuple = ()

  def __iter__(self):
    return iter((self.rewards, self.correct))

  def metrics(self) -> dict[str, float]:
    """``{'reward/timeouts', 'reward/errors', 'reward/invalid'}``: counts of this batch."""
    return {"reward/timeouts": float(self.num_timeouts), "reward/errors": float(self.num_errors),
            "reward/invalid": float(self.num_invalid)}


def sum_metrics(batches: Sequence[Scores]) -> dict[str, float]:
  """The counts of several scored batches of one step (e.g. dynamic-sampling rounds), summed."""
  total = {f"reward/{k}": 0.0 for k in OUTCOMES}
  for scores in batches:
    for key, value in scores.metrics().items():
      total[key] += value
  return total


@dataclasses.dataclass(frozen=True)
class _Judge:
  """What a worker process runs: the checked reward value and the format flag of one completion.
  Compared by value, so the worker pool is reused across calls with the same function."""
  reward_fn: RewardFn
  spec: RewardSpec = BINARY

  def __call__(self, completion: str, problem: Problem) -> tuple:
    """``(value, None, formatted)`` or ``(None, why, False)``. The check runs here, in the
    worker, so that whatever the verifier returned (a 400-digit int, an object whose pickling
    runs code) never reaches the trainer: only floats, bools and strings cross the pipe."""
    value, why = self.spec.check(self.reward_fn(completion, problem))
    if why is not None:
      return None, why, False
    return value, None, bool(format_ok(completion, problem))


def _read_answer(detail) -> tuple[float | None, str | None, bool]:
  """A worker's ``_Judge`` answer; anything else (a custom pool function) is invalid."""
  try:
    value, why, formatted = detail
    if why is not None:
      return None, str(why), False
    return float(value), None, bool(formatted)
  except Exception:
    return None, "malformed answer from the verifier process", False


class FailureLog:
  """A bounded sample of failed verifier calls, appended to a JSON-lines file (``FAILURE_LOG``
  in the run dir): at most ``limit`` records over the life of the file, so a systematic verifier
  bug cannot fill the disk. Completions and prompts are cut to ``max_chars``."""

  def __init__(self, path: str, limit: int = 100, max_chars: int = 2000):
    self.path, self.limit, self.max_chars = path, limit, max_chars
    self.written = 0
    if os.path.exists(path):
      with open(path, "rb") as f:
        self.written = sum(1 for _ in f)

  def append(self, failures: Sequence[dict]) -> None:
    room = self.limit - self.written
    if room <= 0 or not failures:
      return
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    with open(self.path, "a", encoding="utf-8") as f:
      for record in failures[:room]:
        cut = {k: (v[:self.max_chars] if isinstance(v, str) else v) for k, v in record.items()}
        f.write(json.dumps(cut) + "\n")
    self.written += min(room, len(failures))


def score_completions(
    fn: str | RewardFn,
    completions: Sequence[str],
    problems: Sequence[Problem],
    *,
    wrong_value: float = 0.0,
    format_weight: float = 0.0,
    timeout_s: float = 5.0,
    workers: int = 4,
    spec: RewardSpec | None = None,
    failure_log: FailureLog | None = None,
    max_worker_memory_mb: int = 0,
    worker_max_calls: int = 0,
) -> Scores:
  """Score ``completions[i]`` against ``problems[i]`` with the reward function ``fn``.

  Every call runs in a worker process (``rljax.rewards.isolation``) killed after ``timeout_s``,
  so the bound holds for verifiers that hold the GIL or never return; ``workers=0`` calls the
  verifier in this process instead (no bound: for fast verifiers one trusts).

  Args:
    fn: a name in ``REWARD_FNS`` or a reward function.
    completions: [B] decoded completions (text after the prompt).
    problems: [B] the matching problems (repeat a problem G times for a group).
    wrong_value: reward of a wrong binary answer and of every failed call (``reward.wrong_value``).
    format_weight: weight of the format term (``reward.format_weight``).
    timeout_s: hard per-call limit (``reward.timeout_s``).
    workers: verifier processes (``reward.workers``); 0: none, the calls run here.
    spec: what ``fn`` may return; default: its registered declaration (binary if unregistered).
    failure_log: where a bounded sample of failed calls is appended (None: nowhere).
    max_worker_memory_mb: memory a worker may add (``reward.max_worker_memory_mb``; 0: no limit).
    worker_max_calls: calls after which a worker is replaced (``reward.worker_max_calls``).
  """
  if len(completions) != len(problems):
    raise ValueError(
        f"{len(completions)} completions but {len(problems)} problems; pass one problem per row")
  if workers < 0 or not timeout_s > 0:
    raise ValueError(f"reward.workers={workers} must be >= 0, reward.timeout_s={timeout_s} > 0")
  reward_fn = get_reward_fn(fn) if isinstance(fn, str) else fn
  spec = spec or reward_spec(fn)
  for module in spec.preload:
    importlib.import_module(module)
  outcomes = isolation.run_isolated(_Judge(reward_fn, spec), list(zip(completions, problems)),
                                    timeout_s=timeout_s, workers=workers,
                                    max_worker_memory_mb=max_worker_memory_mb,
                                    worker_max_calls=worker_max_calls)
  n = len(outcomes)
  values = np.full(n, np.nan)
  formatted = np.zeros(n, bool)
  counts = dict.fromkeys(OUTCOMES, 0)
  failures = []
  for i, outcome in enumerate(outcomes):
    status, detail = outcome.status, outcome.value
    if status == "ok":
      value, why, formatted[i] = _read_answer(detail)
      if why is None:
        values[i] = value
        continue
      status, detail = "invalid", why
    kind = {"timeout": "timeouts", "error": "errors", "invalid": "invalid"}[status]
    counts[kind] += 1
    failures.append({"outcome": status, "detail": detail or f"no answer in {timeout_s} s",
                     "completion": completions[i], "prompt": problems[i].prompt})
  ok = ~np.isnan(values)
  correct = ok & (values >= spec.high)
  if spec.binary:
    rewards = np.where(correct, 1.0, wrong_value)
  else:
    rewards = np.where(ok, values, wrong_value)
  rewards = rewards + format_weight * formatted
  if failures:  # one line per batch: a systematic verifier bug would otherwise flood the log
    logging.warning("%d of %d reward calls failed (%s; scored %s); first: %s", len(failures), n,
                    ", ".join(f"{v} {k}" for k, v in counts.items() if v), wrong_value,
                    failures[0]["detail"])
    if failure_log is not None:
      failure_log.append(failures)
  return Scores(rewards=rewards.astype(np.float32), correct=correct, formatted=formatted,
                num_timeouts=counts["timeouts"], num_errors=counts["errors"],
                num_invalid=counts["invalid"], failures=tuple(failures))


def task_verifier(reward_config, failure_log_path: str | None = None) -> Callable:
  """``verify(completions, problems) -> Scores`` for the config's ``reward`` section; failed
  calls are sampled into ``failure_log_path`` (at most ``reward.max_logged_failures``)."""
  r = reward_config
  fn = get_reward_fn(r.fn)
  log = None if failure_log_path is None else FailureLog(failure_log_path, r.max_logged_failures)

  def verify(completions, problems) -> Scores:
    return score_completions(fn, completions, problems, wrong_value=r.wrong_value,
                             format_weight=r.format_weight, timeout_s=r.timeout_s,
                             workers=r.workers, failure_log=log,
                             max_worker_memory_mb=r.max_worker_memory_mb,
                             worker_max_calls=r.worker_max_calls)
  return verify

"""Embedded verifiable tasks: procedurally generated problems with exact answers.

Every task writes its reference solution as a short chain of thought followed by the final
answer after a marker, e.g. ``"3*4=12,7+12=19 #19"``; verifiers read what follows the *last*
marker. Problems are a pure function of ``(task, difficulty, seed, index)``.

Train/eval split: the problem space is split by a hash of the prompt text (``EVAL_PERMILLE`` per
mille of all prompts are eval prompts). ``train_stream`` never yields an eval prompt and
``eval_set`` only yields eval prompts, whatever the seeds and difficulties, so evaluation always
measures generalisation to unseen problems.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import itertools
import random
import re
from typing import Iterator

from rljax.data.sources import register_data_source
from rljax.registries import TASKS

MARKER = "#"
EVAL_PERMILLE = 100  # 10% of the problem space is held out for evaluation
_EVAL_PATIENCE = 50_000  # draws without a new eval prompt before eval_set gives up
_INT = re.compile(r"-?\d+")


@dataclasses.dataclass(frozen=True)
class Problem:
  """One prompt with its gold answer.

  Attributes:
    prompt: the text the model continues.
    answer: the gold final answer (what a verifier compares against).
    solution: a reference completion (chain of thought + ``" #answer"``) for SFT; ``""`` if none.
    meta: provenance, e.g. ``{'task': 'arithmetic', 'difficulty': 1}`` or ``{'line': 3}``. A
      multi-turn task's ``meta['episode']`` is its solution cut into the policy's turns and the
      environment's observations, alternating from a policy turn (text, or a tuple: a turn's
      calls ``((name, arguments), ...)`` and their results ``(text, ...)``, which the cold start
      writes in the run's tool format; ``solution`` is the compact text): the SFT cold start
      learns the turns only.
    images: the images the prompt shows (``rljax.data.images.Image``), one ``<image>`` marker in
      ``prompt`` where each goes; ``()`` for a text prompt (every text-only path ignores it).
  """
  prompt: str
  answer: str
  solution: str = ""
  meta: dict = dataclasses.field(default_factory=dict)
  images: tuple = ()


def marked_answer(completion: str) -> str | None:
  """The text after the last ``MARKER``, stripped; None when there is no marker."""
  head, sep, tail = completion.rpartition(MARKER)
  return tail.strip() if sep else None


def marked_integer_matches(completion: str, problem: Problem) -> float:
  """1.0 if the integer after the last ``MARKER`` equals ``problem.answer``, else 0.0."""
  got = marked_answer(completion)
  return float(got is not None and _INT.fullmatch(got) is not None
               and int(got) == int(problem.answer))


def is_eval_prompt(prompt: str) -> bool:
  """Whether ``prompt`` belongs to the held-out eval part of the problem space (stable hash)."""
  digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little") % 1000 < EVAL_PERMILLE


class Task(abc.ABC):
  """A generator of problems at one difficulty, plus its verifier."""

  name: str = ""
  levels: dict = {}  # difficulty -> level parameters
  # Train and eval problems are told apart by a hash of the prompt (``is_eval_prompt``); a task
  # whose problems share one prompt (the hidden state is not in it) splits otherwise.
  split_by_prompt: bool = True
  # Solutions end with `` #<answer>`` (``MARKER``); an episode task (guess) answers otherwise.
  marked_answer: bool = True
  # Its problems show images (``Problem.images``): the policy must take images.
  images: bool = False

  def __init__(self, difficulty: int):
    if difficulty not in self.levels:
      raise ValueError(
          f"data.difficulty={difficulty!r} is not a level of task {self.name!r}; "
          f"allowed: {sorted(self.levels)}")
    self.difficulty = difficulty
    self.level = self.levels[difficulty]

  @abc.abstractmethod
  def sample(self, rng: random.Random) -> Problem:
    """One problem drawn from the whole space (train and eval parts alike)."""

  @abc.abstractmethod
  def verify(self, completion: str, problem: Problem) -> float:
    """1.0 if ``completion`` (the text after the prompt) solves ``problem``, else 0.0."""

  @abc.abstractmethod
  def format_ok(self, completion: str) -> bool:
    """Whether ``completion`` has the task's shape (steps, marker, final answer), right or not."""

  def _rng(self, *parts) -> random.Random:
    # String seeds go through SHA-512 in `random`: stable across runs and PYTHONHASHSEED.
    return random.Random("/".join(str(p) for p in (self.name, self.difficulty) + parts))

  def problem_at(self, seed: int, index: int) -> Problem:
    """Train problem number ``index`` of stream ``seed`` (random access, for cheap resumes)."""
    rng = self._rng("train", seed, index)
    while True:
      problem = self.sample(rng)
      if not is_eval_prompt(problem.prompt):
        return problem

  def train_stream(self, seed: int, start: int = 0) -> Iterator[Problem]:
    """Infinite stream of train problems, beginning at position ``start``."""
    return (self.problem_at(seed, i) for i in itertools.count(start))

  def eval_set(self, seed: int, n: int) -> list[Problem]:
    """``n`` distinct held-out problems drawn with ``seed``."""
    rng = self._rng("eval", seed)
    problems, seen, draws_without_new = [], set(), 0
    # A level whose eval part is smaller than n would loop forever: give up once new eval
    # prompts have stopped appearing (far beyond the coupon-collector tail of a real pool).
    while len(problems) < n and draws_without_new < _EVAL_PATIENCE:
      problem = self.sample(rng)
      if is_eval_prompt(problem.prompt) and problem.prompt not in seen:
        seen.add(problem.prompt)
        problems.append(problem)
        draws_without_new = 0
      else:
        draws_without_new += 1
    if len(problems) < n:
      raise ValueError(
          f"task {self.name!r} difficulty {self.difficulty} has only {len(problems)} distinct "
          f"eval problems; data.num_eval={n} is too many for this level")
    return problems

  def _meta(self, **extra) -> dict:
    return {"task": self.name, "difficulty": self.difficulty, **extra}


# --- arithmetic --------------------------------------------------------------------------------

def register_task(cls):
  """Class decorator adding a ``Task`` subclass to ``TASKS`` (``rljax.registries``) under its
  ``name``: ``data.source='embedded:<name>'``; the registration states whether its problems show
  images (``images``)."""
  return TASKS.register(cls.name, images=cls.images)(cls)


@dataclasses.dataclass(frozen=True)
class ArithmeticLevel:
  num_operands: int
  max_operand: int
  ops: str
  paren_prob: float  # chance that one adjacent pair is parenthesised (evaluated first)
  max_abs_value: int  # cap on every intermediate result (keeps solutions short)


# The integer operators of the generated tasks: symbol -> function.
OPERATORS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


@register_task
class Arithmetic(Task):
  """Evaluate an integer expression step by step.

  ``"7+3*4="`` -> ``"3*4=12,7+12=19 #19"``. One step per operator, in evaluation order:
  the parenthesised pair first, then ``*`` left to right, then ``+``/``-`` left to right.
  """

  name = "arithmetic"
  # Calibrated with the default tiny policy (hidden 128, 4 layers) after the default SFT cold
  # start (600 steps x 64), greedy eval accuracy: level 0 ~0.78, level 1 ~0.51 (pass@8 at T=1
  # 0.66, so RL has room to improve), level 2 ~0.07; level 3 is harder still.
  levels = {
      0: ArithmeticLevel(3, 9, "+-*", 0.0, 999),
      1: ArithmeticLevel(4, 9, "+-*", 0.5, 9999),
      2: ArithmeticLevel(4, 19, "+-*", 0.5, 999),
      3: ArithmeticLevel(5, 19, "+-*", 0.5, 999),
  }
  _FORMAT = re.compile(r"(-?\d+[-+*]-?\d+=-?\d+)(,-?\d+[-+*]-?\d+=-?\d+)* #-?\d+\s*")

  def sample(self, rng: random.Random) -> Problem:
    lv = self.level
    while True:  # redraw expressions whose intermediate results exceed the level's cap
      nums = [rng.randint(0, lv.max_operand) for _ in range(lv.num_operands)]
      ops = [rng.choice(lv.ops) for _ in range(lv.num_operands - 1)]
      paren = rng.randrange(len(ops)) if rng.random() < lv.paren_prob else None
      steps, values = _evaluate_steps(nums, ops, paren)
      if max(abs(v) for v in values) <= lv.max_abs_value:
        break
    answer = values[-1]
    return Problem(
        prompt=_render_expression(nums, ops, paren) + "=",
        answer=str(answer),
        solution=",".join(steps) + f" {MARKER}{answer}",
        meta=self._meta())

  def verify(self, completion: str, problem: Problem) -> float:
    return marked_integer_matches(completion, problem)

  def format_ok(self, completion: str) -> bool:
    return self._FORMAT.fullmatch(completion) is not None


def _render_expression(nums: list[int], ops: list[str], paren: int | None) -> str:
  """``[7,3,4], ['+','*'], None`` -> ``'7+3*4'``; ``paren=k`` wraps operands k and k+1."""
  text = ""
  for i, n in enumerate(nums):
    if i > 0:
      text += ops[i - 1]
    if i == paren:
      text += "("
    text += str(n)
    if paren is not None and i == paren + 1:
      text += ")"
  return text


def _evaluate_steps(nums: list[int], ops: list[str], paren: int | None):
  """Reduce the expression one operator at a time; returns (step strings, step results).

  The last step result is the value of the expression.
  """
  nums, ops, steps, values = list(nums), list(ops), [], []
  while ops:
    k = _next_operator(ops, paren)
    a, op, b = nums[k], ops[k], nums[k + 1]
    value = OPERATORS[op](a, b)
    steps.append(f"{a}{op}{b}={value}")
    values.append(value)
    nums[k:k + 2], paren = [value], None
    del ops[k]
  return steps, values


def _next_operator(ops: list[str], paren: int | None) -> int:
  if paren is not None:
    return paren
  for k, op in enumerate(ops):
    if op == "*":
      return k
  return 0


# --- countdown ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CountdownLevel:
  num_numbers: int
  max_number: int
  ops: str
  max_value: int  # cap on every intermediate result (keeps solutions short)


@register_task
class Countdown(Task):
  """Reach the target using every given number exactly once.

  ``"3 5 7>22:"`` -> ``"5*3=15,15+7=22 #22"``. Each step combines two available numbers into a
  new positive integer (``/`` only when exact); the last result must be the target. The verifier
  replays the steps, so any valid route counts, not only the reference one.
  """

  name = "countdown"
  levels = {
      0: CountdownLevel(3, 12, "+-*", 144),
      1: CountdownLevel(3, 20, "+-*/", 199),
      2: CountdownLevel(4, 9, "+-*", 199),
      3: CountdownLevel(4, 20, "+-*/", 499),
  }
  _PROMPT = re.compile(r"(\d+(?: \d+)*)>(\d+):")
  _STEP = re.compile(r"\s*(\d+)([-+*/])(\d+)=(\d+)\s*")
  _FORMAT = re.compile(r"(\d+[-+*/]\d+=\d+)(,\d+[-+*/]\d+=\d+)* #\d+\s*")

  def sample(self, rng: random.Random) -> Problem:
    lv = self.level
    while True:  # retry the rare draws where no operator keeps a step in range
      numbers = [rng.randint(1, lv.max_number) for _ in range(lv.num_numbers)]
      steps = self._random_route(numbers, rng)
      if steps is not None:
        break
    target = steps[-1][3]
    prompt = " ".join(map(str, sorted(numbers))) + f">{target}:"
    text = ",".join(f"{a}{op}{b}={c}" for a, op, b, c in steps)
    return Problem(prompt=prompt, answer=str(target), solution=f"{text} {MARKER}{target}",
                   meta=self._meta(numbers=sorted(numbers), target=target))

  def _random_route(self, numbers: list[int], rng: random.Random):
    """Combine random pairs until one number is left; None if a step has no valid operator."""
    pool, steps = list(numbers), []
    while len(pool) > 1:
      a, b = (pool.pop(rng.randrange(len(pool))) for _ in range(2))
      a, b = max(a, b), min(a, b)  # larger first: subtraction and division stay positive
      choices = [op for op in self.level.ops
                 if (c := _countdown_apply(a, op, b)) is not None and c <= self.level.max_value]
      if not choices:
        return None
      op = rng.choice(choices)
      c = _countdown_apply(a, op, b)
      steps.append((a, op, b, c))
      pool.append(c)
    return steps

  def verify(self, completion: str, problem: Problem) -> float:
    numbers, target = self.parse_prompt(problem.prompt)
    head, sep, tail = completion.rpartition(MARKER)
    if not sep or tail.strip() != str(target):
      return 0.0
    pool = list(numbers)
    for step in head.split(","):
      match = self._STEP.fullmatch(step)
      if match is None:
        return 0.0
      a, op, b, c = int(match[1]), match[2], int(match[3]), int(match[4])
      if a not in pool or _countdown_apply(a, op, b) != c:
        return 0.0
      pool.remove(a)
      if b not in pool:
        return 0.0
      pool.remove(b)
      pool.append(c)
    return float(pool == [target])

  def format_ok(self, completion: str) -> bool:
    return self._FORMAT.fullmatch(completion) is not None

  def parse_prompt(self, prompt: str) -> tuple[list[int], int]:
    """``'3 5 7>22:'`` -> ``([3, 5, 7], 22)``."""
    match = self._PROMPT.fullmatch(prompt)
    if match is None:
      raise ValueError(f"{prompt!r} is not a countdown prompt like '3 5 7>22:'")
    return [int(x) for x in match[1].split()], int(match[2])


def _countdown_apply(a: int, op: str, b: int) -> int | None:
  """``a op b`` when it is a positive integer, else None."""
  if op == "/":
    return a // b if b > 1 and a % b == 0 else None
  if op not in OPERATORS:
    return None
  c = OPERATORS[op](a, b)
  return c if c > 0 else None


# --- the embedded tasks ------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def make_task(name: str, difficulty: int = 1) -> Task:
  """The task ``name`` of ``TASKS`` at ``difficulty`` (tasks are stateless, so cached)."""
  return TASKS.get(name)(difficulty)


@register_data_source("embedded")
def embedded_source(arg: str, settings) -> Task:
  """``data.source='embedded:<task>'``: a task of ``TASKS`` generated at ``data.difficulty``
  (``arithmetic``, ``countdown``; multi-turn environments pose them too, e.g. ``tool_calc``'s
  products)."""
  return make_task(arg, settings["difficulty"])

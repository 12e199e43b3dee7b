"""``guess``: find a hidden number in [1, N] from higher / lower replies, in few turns.

Every turn is one call of the environment's own ``guess`` tool; the environment answers whether
the hidden number is higher or lower. The episode ends when the number is found (reward
``(K + 1 - t) / K`` at turn ``t`` of at most ``K = env.max_turns``: shorter is better), when a
turn holds no guess (reward 0) or after ``K`` turns (reward 0). An unreadable guess is answered
``error`` and costs its turn. Compact format (the char-level tasks')::

  prompt 'guess 1-16:'  ->  '<guess 8>' ' higher\\n' '<guess 12>' ' lower\\n' '<guess 10>'

(policy turns and environment observations alternating; the last guess is right). Bisection needs
at most ``ceil(log2(N + 1))`` turns. The task's reference solutions, which the SFT cold start
learns from, mix bisection (``bisect_prob`` of them) with guessing uniformly among the numbers
still possible, which takes more turns: RL has turns to save.

The hidden number is not in the prompt, so all problems of a level share one prompt and the
train / eval split is by problem index instead of by prompt: the eval set cycles through
``1..N`` in a seeded order (every number equally often), the train stream draws numbers
uniformly. Nothing about a hidden number can be memorised from its prompt either way.
"""
from __future__ import annotations

import dataclasses
import random
import re

from rljax.data import tasks as tasks_lib
from rljax.data.tasks import Problem, Task
from rljax.envs import tools as tools_lib
from rljax.envs.base import Environment, StepResult, register_env

HIGHER, LOWER, WRONG = " higher\n", " lower\n", "error\n"
_NUMBER = re.compile(r"\s*(\d{1,9})\s*")


@dataclasses.dataclass(frozen=True)
class GuessLevel:
  n: int  # numbers 1..n
  bisect_prob: float  # share of reference solutions that bisect
  max_demo_turns: int  # reference solutions are redrawn until they need at most this many turns


class GuessTask(Task):
  """Problems of the guess environment: the hidden number is the answer (module docstring)."""

  name = "guess"
  split_by_prompt = False  # one prompt per level: train and eval split by problem index
  marked_answer = False  # the answer is the last guess of the episode
  levels = {
      0: GuessLevel(16, 0.3, 5),  # bisection needs at most 5 turns
      1: GuessLevel(32, 0.3, 6),
      2: GuessLevel(64, 0.3, 7),
  }

  def _problem(self, hidden: int, rng: random.Random) -> Problem:
    n = self.level.n
    episode = self.demonstration(hidden, rng)
    return Problem(prompt=f"guess 1-{n}:", answer=str(hidden), solution="".join(episode),
                   meta=self._meta(n=n, episode=episode))

  def demonstration(self, hidden: int, rng: random.Random) -> tuple:
    """A reference episode, guesses and replies alternating: bisection, or uniform guesses among
    the numbers still possible."""
    lv = self.level
    bisect = rng.random() < lv.bisect_prob
    while True:
      lo, hi, episode = 1, lv.n, []
      while True:
        guess = (lo + hi) // 2 if bisect else rng.randint(lo, hi)
        episode.append(tools_lib.render_call("guess", {"number": guess}, "compact"))
        if guess == hidden:
          break
        episode.append(HIGHER if hidden > guess else LOWER)
        lo, hi = (guess + 1, hi) if hidden > guess else (lo, guess - 1)
      if (len(episode) + 1) // 2 <= lv.max_demo_turns or bisect:
        return tuple(episode)

  def sample(self, rng: random.Random) -> Problem:
    return self._problem(rng.randint(1, self.level.n), rng)

  def problem_at(self, seed: int, index: int) -> Problem:
    return self.sample(self._rng("train", seed, index))

  def eval_set(self, seed: int, n: int) -> list[Problem]:
    rng = self._rng("eval", seed)
    order = list(range(1, self.level.n + 1))
    rng.shuffle(order)
    return [self._problem(order[i % len(order)], rng) for i in range(n)]

  def verify(self, completion: str, problem: Problem) -> float:
    """Single-turn use: whether the last guess written is the hidden number."""
    calls = [c for c in tools_lib.parse_tool_calls(completion, "compact") if c.error is None]
    return float(bool(calls) and calls[-1].arguments.get("", "").strip() == problem.answer)

  def format_ok(self, completion: str) -> bool:
    return bool(re.fullmatch(r"(<guess \d+>( higher\n| lower\n))*<guess \d+>\s*", completion))


tasks_lib.register_task(GuessTask)


@register_env("guess")
class GuessEnv(Environment):
  """Higher / lower replies to ``guess`` calls (module docstring)."""

  def reset(self, problem):
    self.hidden = int(problem.answer)
    self.turns = 0
    return problem.prompt

  def _reply(self, text: str) -> str:
    if self.tool_format == "hermes":
      return tools_lib.tool_messages([text.strip()])
    return text

  def step(self, action: str) -> StepResult:
    self.turns += 1
    calls = tools_lib.parse_tool_calls(action, self.tool_format)
    if not calls:  # no guess: the episode ends unsolved
      return StepResult("", 0.0, True, {"correct": False})
    call = calls[-1]
    value = None
    if call.error is None and call.name == "guess":
      argument = next(iter(call.arguments.values()), "") if call.arguments else ""
      match = _NUMBER.fullmatch(str(argument))
      value = int(match.group(1)) if match else None
    info = {"tool_calls": len(calls), "tool_errors": int(value is None)}
    if value is None:
      return StepResult(self._reply(WRONG), 0.0, False, info)
    if value == self.hidden:
      reward = (self.max_turns + 1 - self.turns) / self.max_turns
      return StepResult("", max(reward, 0.0), True, dict(info, correct=True))
    return StepResult(self._reply(HIGHER if self.hidden > value else LOWER), 0.0, False, info)

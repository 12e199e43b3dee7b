"""``tool_calc``: arithmetic a tiny model cannot do in its head, with a calculator tool.

The task (``data.source='embedded:tool_calc'``) asks for products of a 3-digit and a 2-digit
number (level 0, ``'123*45='``) or such a product plus a 3-digit number (level 1,
``'123*45+678='``). Its reference solutions, which the SFT cold start learns from, use the
calculator in a share ``tool_prob`` of the problems and answer directly (usually wrongly, for a
small model) otherwise::

  '123*45='  ->  '<calc 123*45>5535 #5535'   (tool: the call, the observation '5535', the answer)
  '123*45='  ->  ' #5535'                     (no tool)

The cold start learns the call and the answer, not the observation (``meta['episode']``), as RL
trains on the policy's tokens only: a policy that learned to predict the calculator's digits
would compete with copying them.

The environment (``env.name='tool_calc'``) answers ``calc`` calls with the calculator and scores
the final answer (the text after the last ``#`` of the turn without a call) against the problem's:
reward 1 if equal, else 0. It works with any problem whose answer is a number (e.g.
``embedded:arithmetic`` too). A demonstration's call and result are structured, and the cold start
writes them in the run's ``env.tool_format`` (``rljax.train.sft.encode_example``): compact for the
char vocabulary (no braces or quotes for the hermes one), hermes in the chat template's form.
"""
from __future__ import annotations

import dataclasses
import random
import re

from rljax.data import tasks as tasks_lib
from rljax.data.tasks import MARKER, Problem, Task, marked_answer
from rljax.envs.base import register_env
from rljax.envs.tool_env import ToolEnv
from rljax.envs.tools import render_calls, tool_observation

_INT = re.compile(r"-?\d+")


@dataclasses.dataclass(frozen=True)
class ToolCalcLevel:
  a: tuple  # (lo, hi) of the first factor
  b: tuple  # (lo, hi) of the second factor
  addend: tuple | None  # (lo, hi) of a number added to the product; None: no addition
  tool_prob: float  # share of reference solutions that use the calculator


class ToolCalcTask(Task):
  """Products (plus a sum at level 1) with calculator-using reference solutions (module doc)."""

  name = "tool_calc"
  levels = {
      0: ToolCalcLevel((100, 999), (10, 99), None, 0.3),
      1: ToolCalcLevel((100, 999), (10, 99), (100, 999), 0.3),
  }
  _FORMAT = re.compile(r"(<calc [0-9+*\-/() ]+>-?\d+)? #-?\d+\s*")

  def sample(self, rng: random.Random) -> Problem:
    lv = self.level
    a, b = rng.randint(*lv.a), rng.randint(*lv.b)
    expression, answer = f"{a}*{b}", a * b
    if lv.addend is not None:
      c = rng.randint(*lv.addend)
      expression, answer = f"{expression}+{c}", answer + c
    use_tool = rng.random() < lv.tool_prob
    final = f" {MARKER}{answer}"
    # The policy's call, the calculator's observation, the policy's answer (or the answer alone);
    # the call and its result structured, so that SFT writes them in the run's tool format.
    episode = ((("calc", {"expression": expression}),), (str(answer),), final) \
        if use_tool else (final,)
    solution = (render_calls(episode[0], "compact") + tool_observation(episode[1], "compact")
                + final) if use_tool else final
    return Problem(prompt=f"{expression}=", answer=str(answer), solution=solution,
                   meta=self._meta(tool=use_tool, episode=episode))

  def verify(self, completion: str, problem: Problem) -> float:
    return float(_answer_matches(completion, problem.answer))

  def format_ok(self, completion: str) -> bool:
    return self._FORMAT.fullmatch(completion) is not None


def _answer_matches(text: str, gold: str) -> bool:
  got = marked_answer(text)
  return got is not None and _INT.fullmatch(got) is not None and _INT.fullmatch(gold.strip()) \
      is not None and int(got) == int(gold)


tasks_lib.register_task(ToolCalcTask)


@register_env("tool_calc")
class ToolCalcEnv(ToolEnv):
  """Calculator calls answered, the final answer (after ``#``) scored 1 if right, else 0."""

  def score(self, answer: str) -> tuple[float, bool]:
    right = _answer_matches(answer, self.problem.answer)
    return float(right), right

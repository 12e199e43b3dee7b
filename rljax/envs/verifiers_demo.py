"""Two small ``verifiers`` environments written as the library's documentation writes one (a
``load_environment`` function returning a ``vf.Environment``), for ``configs/tasks/verifiers.py``
and the tests: their datasets are generated here, so nothing is downloaded.

- ``load_arith_environment``: a ``vf.SingleTurnEnv`` of integer sums and products
  (``'7+35='`` -> ``'#42'``), scored by a ``vf.Rubric`` of two reward functions: the answer (the
  text after the last ``#`` of the reply, else the whole reply) equals the gold one (weight 1), and
  it is an integer (weight ``format_weight``);
- ``load_calc_environment``: a ``vf.ToolEnv`` of 3-digit by 2-digit products (``'123*45='``) with
  a ``calc`` tool (``rljax.envs.tools.calc``): the policy may call it (``'<calc 123*45>'`` in the
  compact format; a failed call is answered ``error``) and answers in a turn without a call;
  the same rubric, and the library's tool metrics.

  data.source='verifiers:rljax.envs.verifiers_demo:load_calc_environment'

Both are plain text in the char tokenizer's vocabulary (no system prompt).
"""
from __future__ import annotations

import random
import re

from rljax.envs import tools as tools_lib

_INT = re.compile(r"-?\d+")


def final_answer(text: str) -> str:
  """The text after the last ``#`` (the whole text without one), stripped."""
  return text.rpartition("#")[2].strip()


def _reply(parser, completion) -> str:
  return parser.parse_answer(completion) or ""


def correct_answer(parser, completion, answer) -> float:
  """1 when the reply's final answer is the gold answer."""
  return float(final_answer(_reply(parser, completion)) == str(answer))


def integer_answer(parser, completion) -> float:
  """1 when the reply's final answer is an integer, right or not (a format reward)."""
  return float(_INT.fullmatch(final_answer(_reply(parser, completion))) is not None)


def _rubric(vf, format_weight: float):
  return vf.Rubric(funcs=[correct_answer, integer_answer], weights=[1.0, format_weight])


def _rows(make, n: int, seed: int, distinct: int) -> list[dict]:
  """``n`` rows of distinct questions drawn by ``make``; more than the ``distinct`` questions it
  can draw is a ValueError (drawing until ``n`` would never end)."""
  if n > distinct:
    raise ValueError(f"num_examples={n} is more than the {distinct} distinct problems this "
                     "environment has")
  rng = random.Random(f"verifiers_demo/{seed}")
  rows, seen = [], set()
  while len(rows) < n:
    question, answer = make(rng)
    if question not in seen:
      seen.add(question)
      rows.append({"question": question, "answer": str(answer)})
  return rows


def _arith(rng, max_operand: int):
  a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice("+*")
  return f"{a}{op}{b}=", a + b if op == "+" else a * b


def _product(rng):
  a, b = rng.randint(100, 999), rng.randint(10, 99)
  return f"{a}*{b}=", a * b


def calc(expression: str) -> str:
  """Evaluates an arithmetic expression of integers with + - * / and parentheses.

  Args:
    expression: the expression, e.g. 123*45.
  """
  return tools_lib.calc(expression)


def load_arith_environment(num_examples: int = 2000, max_operand: int = 99, seed: int = 0,
                           format_weight: float = 0.1):
  """A single-turn environment of ``a+b=`` / ``a*b=`` problems (module docstring)."""
  import verifiers as vf  # optional extra [verifiers]
  from datasets import Dataset  # a dependency of verifiers
  rows = _rows(lambda rng: _arith(rng, max_operand), num_examples, seed,
               distinct=2 * (max_operand + 1) ** 2)  # a+b= and a*b=, a and b in 0..max_operand
  return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=_rubric(vf, format_weight))


def load_calc_environment(num_examples: int = 2000, seed: int = 0, max_turns: int = 3,
                          format_weight: float = 0.1):
  """A tool environment of ``123*45=`` problems with the ``calc`` tool (module docstring)."""
  import verifiers as vf  # optional extra [verifiers]
  from datasets import Dataset  # a dependency of verifiers
  rows = _rows(_product, num_examples, seed, distinct=900 * 90)  # 3-digit by 2-digit
  # A failed call is answered 'error' (the library's default answer, the exception's text, may
  # hold characters the char tokenizer lacks).
  return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[calc], max_turns=max_turns,
                    error_formatter=lambda e: "error", rubric=_rubric(vf, format_weight))

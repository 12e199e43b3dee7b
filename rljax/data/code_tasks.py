"""Code tasks: ``data.source='code:PATH'``, a JSONL file of programming problems checked by unit
tests (``reward.fn='code_tests'`` / ``'code_tests_all'``, run in the sandbox by
``rljax.agents.code``).

One JSON object per line, in either of the common layouts:

- MBPP: ``text`` (or ``prompt``) the problem, ``test_list`` a list of statements (usually
  ``assert f(1) == 2``), ``test_setup_code`` optional code run first, ``code`` a reference
  solution (optional, for SFT);
- HumanEval: ``prompt`` a signature and docstring the model completes, ``test`` code defining
  ``check(candidate)``, ``entry_point`` the function's name, ``canonical_solution`` the body
  (optional);

or rljax's own: ``prompt``, ``tests`` (a list of statements), ``setup``, ``entry_point`` and
``solution``, all but ``prompt`` and ``tests`` optional. Each row becomes a ``Problem`` whose
``answer`` is the JSON of its checks (``CodeChecks``): what a completion's program must pass.
A row without a prompt or tests is an error naming the file and line.
"""
from __future__ import annotations

import dataclasses
import json
import os

from rljax.data.datasets import screen_rows
from rljax.data.sources import Rows, register_data_source
from rljax.data.tasks import Problem
from rljax.errors import DataError, DataFileNotFoundError

SOURCE_KIND = "code"


@dataclasses.dataclass(frozen=True)
class CodeChecks:
  """What a program is checked with: ``tests`` (statements, each one check), ``setup`` (run
  before the program), ``entry_point`` (the function a HumanEval-style prompt defines: a
  completion that does not define it is appended to the prompt)."""
  tests: tuple
  setup: str = ""
  entry_point: str = ""

  def to_json(self) -> str:
    return json.dumps({"tests": list(self.tests), "setup": self.setup,
                       "entry_point": self.entry_point}, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "CodeChecks":
    d = json.loads(text)
    return cls(tuple(d["tests"]), d.get("setup", ""), d.get("entry_point", ""))


def _strings(value, what: str, where: str) -> tuple:
  if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
    raise DataError(f"{where}: {what} must be a non-empty list of strings")
  return tuple(value)


def row_problem(row: dict, where: str) -> Problem:
  """One row (module docstring) as a ``Problem``."""
  if not isinstance(row, dict):
    raise DataError(f"{where}: a code task is a JSON object, got {type(row).__name__}")
  prompt = row.get("prompt", row.get("text"))
  if not isinstance(prompt, str) or not prompt.strip():
    raise DataError(f"{where}: no prompt (a string field 'prompt' or MBPP's 'text')")
  entry = row.get("entry_point") or ""
  if "tests" in row or "test_list" in row:
    key = "tests" if "tests" in row else "test_list"
    tests = _strings(row[key], key, where)
  elif isinstance(row.get("test"), str) and entry:  # HumanEval: check(candidate)
    tests = (f"{row['test']}\ncheck({entry})",)
  else:
    raise DataError(f"{where}: no tests ('tests' or MBPP's 'test_list', or HumanEval's 'test' "
                    "with 'entry_point')")
  setup = row.get("setup", row.get("test_setup_code")) or ""
  solution = row.get("solution", row.get("code", row.get("canonical_solution"))) or ""
  for name, value in (("setup", setup), ("entry_point", entry), ("solution", solution)):
    if not isinstance(value, str):
      raise DataError(f"{where}: {name} must be a string")
  checks = CodeChecks(tests, setup, entry)
  return Problem(prompt=prompt, answer=checks.to_json(), solution=solution,
                 meta={"source": where.rsplit(":", 1)[0], "line": where.rsplit(":", 1)[-1]})


def read_code_tasks(path: str) -> list[Problem]:
  """The problems of a code-task JSONL file (module docstring)."""
  if not os.path.isfile(path):
    raise DataFileNotFoundError(f"data.source file {path!r} does not exist")
  problems = []
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{path}:{line_number}: not valid JSON ({e.msg})") from None
      problems.append(row_problem(row, f"{path}:{line_number}"))
  return problems


@register_data_source(SOURCE_KIND, files=lambda path: [path])
def code_source(path: str, settings) -> Rows:
  """``data.source='code:PATH'``: programming problems checked by unit tests, a JSONL file in the
  MBPP or HumanEval layout (``reward.fn='code_tests'``), screened by ``data.invalid_rows``."""
  rows, invalid = screen_rows(read_code_tasks(path), settings["invalid_rows"])
  return Rows(rows, invalid_rows=invalid)

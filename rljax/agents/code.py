"""Code execution for agents and rewards, in the sandbox (``rljax.agents.sandbox``):

- ``reward.fn='code_tests'``: the fraction of a code task's unit tests (``data.source=
  'code:PATH'``, ``rljax.data.code_tasks``) that the completion's program passes, in ``[0, 1]``
  (correct when all pass); ``'code_tests_all'``: 1 when all pass, else 0.
- the ``python`` tool (``<python print(1+1)>``, or a hermes call with ``{"code": ...}``): runs
  the code and answers with what it printed.

The program of a completion is its last fenced code block (```` ```python ... ``` ````), or the
whole completion when it has none; when the task names an ``entry_point`` its program does not
define, the completion continues the prompt (HumanEval: the prompt is the signature) and the
program is prompt + completion. The checked program is the task's ``setup``, the program, then
each test in turn, each in its own ``try`` (a failing test does not stop the next), a test
counted as passed when the line that follows it is printed, tagged with a random token of the
run. A program that breaks a sandbox limit (time, memory, processes, output) passes the tests
whose lines it printed before.
"""
from __future__ import annotations

import re
import secrets

from rljax.agents import sandbox
from rljax.data.code_tasks import CodeChecks
from rljax.data.tasks import Problem
from rljax.envs.tools import ToolError, register_tool
from rljax.rewards.checkers import register_reward

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.S | re.I)
TOOL_OUTPUT_CHARS = 2000  # what the python tool answers at most
LIMITS = sandbox.Limits()  # of every program the rewards and the tool run


def program_of(completion: str, problem: Problem, checks: CodeChecks) -> str:
  """The program a completion writes (module docstring)."""
  blocks = _FENCE.findall(completion)
  code = blocks[-1] if blocks else completion
  entry = checks.entry_point
  if entry and not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
    code = problem.prompt + code
  return code


def test_program(program: str, checks: CodeChecks, tag: str) -> str:
  """``setup``, ``program``, then each test in a ``try`` printing ``tag i`` when it passes."""
  lines = [checks.setup, program, "", "def _rljax_checks():"]
  lines.append(f"  for _i, _t in enumerate({list(checks.tests)!r}):")
  lines.append("    try:")
  lines.append("      exec(_t, globals())")
  lines.append("    except BaseException:")
  lines.append("      continue")
  lines.append(f"    print({tag!r}, _i, flush=True)")
  lines.append("_rljax_checks()")
  return "\n".join(lines) + "\n"


def passed_tests(program: str, checks: CodeChecks,
                 limits: sandbox.Limits | None = None) -> tuple[int, sandbox.Run]:
  """``(tests passed, the sandbox run)`` of ``program`` against ``checks`` (``LIMITS``)."""
  tag = "rljax-pass-" + secrets.token_hex(8)
  run = sandbox.run_python(test_program(program, checks, tag), limits or LIMITS)
  passed = {line.split()[1] for line in run.stdout.splitlines()
            if line.startswith(tag + " ") and len(line.split()) == 2}
  return len(passed & {str(i) for i in range(len(checks.tests))}), run


def _fraction(completion: str, problem: Problem) -> float:
  checks = CodeChecks.from_json(problem.answer)
  passed, _ = passed_tests(program_of(completion, problem, checks), checks)
  return passed / len(checks.tests)


@register_reward("code_tests", binary=False, value_range=(0.0, 1.0))
def code_tests(completion: str, problem: Problem) -> float:
  """The fraction of the task's unit tests the completion's program passes (correct: all)."""
  return _fraction(completion, problem)


@register_reward("code_tests_all")
def code_tests_all(completion: str, problem: Problem) -> float:
  """1 when the completion's program passes every unit test of the task, else 0."""
  return float(_fraction(completion, problem) == 1.0)


@register_tool("python", compact_arg="code",
               description="Run Python code in a sandbox; answers with what it printed.")
def python_tool(code: str) -> str:
  """Runs ``code`` in the sandbox: its output (stdout, then stderr), at most
  ``TOOL_OUTPUT_CHARS``; a run that ends badly is a tool error saying why."""
  run = sandbox.run_python(code, LIMITS)
  text = (run.stdout + run.stderr)[-TOOL_OUTPUT_CHARS:]
  if run.status in ("ok", "exit"):
    return text.strip() if run.ok else f"{text.strip()}\n({run.detail})".strip()
  raise ToolError(run.detail)

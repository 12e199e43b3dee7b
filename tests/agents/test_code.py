"""Code tasks and their checks: the JSONL layouts read into problems, unit-test rewards computed
by running programs in the sandbox (a correct, a half-correct, a hanging and a cheating
solution, each with the pass fraction a hand count gives), the python tool, and a run of
``configs/tasks/code.py`` (tiny model, one step) scoring its completions with them."""
import json
import os

import pytest

from rljax import cli
from rljax.agents import code
from rljax.data import code_tasks, datasets
from rljax.envs import tools
from rljax.rewards import checkers
from tests.envs.chat_templates import build_tokenizer
from tests.train import tiny

ROOT = tiny.ROOT
MBPP = {"text": "Write `double(x)`.", "test_list": ["assert double(2) == 4",
                                                   "assert double(0) == 0",
                                                   "assert double(-3) == -6",
                                                   "assert double(5) == 10"]}
HUMANEVAL = {"prompt": "def inc(x):\n    \"\"\"x + 1\"\"\"\n", "entry_point": "inc",
             "test": "def check(f):\n    assert f(1) == 2\n    assert f(-1) == 0\n",
             "canonical_solution": "    return x + 1\n"}


def test_rows_of_both_layouts_become_problems(tmp_path):
  path = tmp_path / "tasks.jsonl"
  path.write_text(json.dumps(MBPP) + "\n\n" + json.dumps(HUMANEVAL) + "\n")
  mbpp, humaneval = code_tasks.read_code_tasks(str(path))
  assert mbpp.prompt == MBPP["text"]
  assert code_tasks.CodeChecks.from_json(mbpp.answer).tests == tuple(MBPP["test_list"])
  checks = code_tasks.CodeChecks.from_json(humaneval.answer)
  assert checks.entry_point == "inc" and checks.tests == (HUMANEVAL["test"] + "\ncheck(inc)",)
  assert humaneval.solution == HUMANEVAL["canonical_solution"]
  rows = datasets.load_problems(f"code:{path}", split="all")
  assert [p.prompt for p in rows] == [MBPP["text"], HUMANEVAL["prompt"]]


def test_a_row_without_tests_names_its_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(MBPP) + "\n" + json.dumps({"prompt": "x"}) + "\n")
  with pytest.raises(code_tasks.DataError, match=r"bad.jsonl:2: no tests"):
    code_tasks.read_code_tasks(str(path))


def _problem(row):
  return code_tasks.row_problem(row, "t:1")


@pytest.mark.parametrize("completion,want", [
    ("Here:\n```python\ndef double(x):\n    return 2 * x\n```", 1.0),
    ("```python\ndef double(x):\n    return x * x if x > 0 else 0\n```", 0.5),  # 2 and 0 pass
    ("def double(x):\n    while True:\n        pass", 0.0),  # the sandbox's CPU limit
    ("```python\nimport os\nprint('rljax-pass-0 0')\nos._exit(0)\n```", 0.0),  # a forged line
    ("not python at all", 0.0)])
def test_the_pass_fraction_is_counted_in_the_sandbox(completion, want, monkeypatch):
  monkeypatch.setattr(code, "LIMITS", code.sandbox.Limits(cpu_s=1, wall_s=10))
  assert code.code_tests(completion, _problem(MBPP)) == want
  assert code.code_tests_all(completion, _problem(MBPP)) == float(want == 1.0)


def test_a_humaneval_completion_continues_its_prompt():
  problem = _problem(HUMANEVAL)
  assert code.code_tests("    return x + 1\n", problem) == 1.0
  assert code.code_tests("    return x\n", problem) == 0.0


def test_the_verifier_workers_run_the_sandbox_and_keep_nothing():
  """Through ``score_completions`` in killable worker processes (child subreapers): a program
  that leaves a process behind is still scored, with no 'left processes' failure."""
  leave = ("```python\nimport os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)\n"
           "def double(x):\n    return 2 * x\n```")
  scores = checkers.score_completions("code_tests", [leave, "nope"],
                                      [_problem(MBPP)] * 2, workers=2, timeout_s=60)
  assert list(scores.rewards) == [1.0, 0.0] and scores.num_errors == 0
  assert list(scores.correct) == [True, False]


def test_the_python_tool_answers_what_the_code_printed():
  assert tools.run_tool(tools.ToolCall("python", {"code": "print(6 * 7)"})) == ("42", True)
  text, ok = tools.run_tool(tools.ToolCall("python", {"code": "import socket\n"
                                                      "socket.create_connection(('1.1.1.1', 80))"}))
  assert ok and "Network is unreachable" in text  # answered: the code ran and failed
  calls = tools.parse_tool_calls("<python print(1+1)>", "compact")
  assert tools.run_tool(calls[0]) == ("2", True)


def test_configs_code_trains_a_step_on_code_tasks(tmp_path):
  tok = build_tokenizer("qwen2.5", str(tmp_path / "tok"))
  run_dir = str(tmp_path / "run")
  overrides = {
      "model.source": "tiny", "model.hidden_size": "32", "model.intermediate_size": "64",
      "model.num_layers": "1", "model.num_heads": "2", "model.num_kv_heads": "1",
      "data.tokenizer": tok, "data.source": f"code:{os.path.join(ROOT, 'configs', 'data', 'code_tasks.jsonl')}",
      "rollout.prompts_per_step": "2", "rollout.group_size": "2", "rollout.max_new_tokens": "16",
      "data.num_eval": "2", "train.steps": "1", "train.eval_every": "0",
      "train.progress": "false", "train.export_hf": "false", "train.run_dir": run_dir}
  cli.main(["train", "--config", os.path.join(ROOT, "configs", "tasks", "code.py")]
           + [f"--config.{k}={v}" for k, v in overrides.items()])
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    (step,) = [m for m in map(json.loads, f) if "loss" in m]
  assert step["reward/errors"] == 0 and step["reward/timeouts"] == 0
  assert "reward/verifier" in step  # code_tests scored the completions

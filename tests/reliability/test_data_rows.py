"""Dataset rows a run cannot learn from are never accepted silently: answers must be text (ints
are read as their decimal text), and empty prompts/answers, NUL bytes and a prompt given two
answers follow data.invalid_rows (error: file:line; drop: counted); a resume on changed data files
is refused unless overridden."""
import hashlib
import json
import os
import re

import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.data import datasets
from rljax.errors import DataError
from rljax.runs import run_dir as run_dir_lib
from tests.train import tiny

GOOD = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(30)]


def _write(path, rows):
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return str(path)


def _with_row_6(tmp_path, row):
  """The file GOOD with ``row`` as its 6th line."""
  return _write(tmp_path / "d.jsonl", GOOD[:5] + [row] + GOOD[5:])


@pytest.mark.parametrize("answer,shown", [(3.0, "3.0 (float)"), ([3], "[3] (list)"),
                                          (True, "true (bool)"), ({"x": 1}, '{"x": 1} (dict)')])
def test_an_answer_that_is_not_text_names_file_and_line(tmp_path, answer, shown):
  path = _with_row_6(tmp_path, {"prompt": "a=", "answer": answer})
  for policy in datasets.INVALID_ROWS:  # a type error is never dropped silently
    with pytest.raises(DataError, match=rf"d.jsonl:6: field 'answer' must be a string \(or an "
                                        rf"integer\), got {re.escape(shown)}"):
      datasets.PromptSource(f"jsonl:{path}", invalid_rows=policy)


def test_an_integer_answer_is_its_decimal_text(tmp_path):
  path = _with_row_6(tmp_path, {"prompt": "a=", "answer": 12})
  rows = datasets.load_problems(f"jsonl:{path}", split="all")
  assert rows[5].answer == "12"


INVALID = [({"prompt": "a=", "answer": " "}, "d.jsonl:6: empty answer", 1),
           ({"prompt": "", "answer": "1"}, "d.jsonl:6: empty prompt", 1),
           ({"prompt": "a\u0000=", "answer": "1"}, "d.jsonl:6: NUL byte in the prompt", 1),
           ({"prompt": "1\u0000", "answer": "1"}, "d.jsonl:6: NUL byte in the prompt", 1),
           # line 3 holds "2+2=" -> "4": both rows go (which answer is right cannot be known)
           ({"prompt": "2+2=", "answer": "5"},
            "d.jsonl:3: the same prompt as d.jsonl:6 with another answer ('4' here, '5' there)",
            2)]


@pytest.mark.parametrize("row,message,dropped", INVALID,
                         ids=["empty-answer", "empty-prompt", "nul", "nul-2", "two-answers"])
def test_invalid_rows_error_or_are_dropped_and_counted(tmp_path, row, message, dropped):
  path = _with_row_6(tmp_path, row)
  with pytest.raises(DataError) as info:
    datasets.PromptSource(f"jsonl:{path}")  # data.invalid_rows='error' by default
  text = str(info.value).replace(str(tmp_path) + "/", "")
  assert text == (f"{message}; fix the row, or set data.invalid_rows='drop' to leave such rows "
                  "out (counted)")
  source = datasets.PromptSource(f"jsonl:{path}", invalid_rows="drop")
  kept = source._rows + source._eval_rows
  assert source.invalid_rows == dropped and len(kept) == 31 - dropped
  assert row["prompt"] not in {p.prompt for p in kept}


def test_same_prompt_same_answer_is_kept(tmp_path):
  path = _with_row_6(tmp_path, dict(GOOD[2]))
  source = datasets.PromptSource(f"jsonl:{path}")
  assert source.invalid_rows == 0 and len(source._rows) + len(source._eval_rows) == 31


def test_invalid_row_through_the_cli_is_one_line_exit_2(tmp_path, capsys):
  path = _with_row_6(tmp_path, {"prompt": "a=", "answer": ""})
  with pytest.raises(SystemExit) as info:
    cli.entry(tiny.args("grpo", str(tmp_path / "run"), {"data.source": f"jsonl:{path}"}))
  assert info.value.code == 2
  assert capsys.readouterr().err == f"error: {path}:6: empty answer; fix the row, or set " \
                                    "data.invalid_rows='drop' to leave such rows out (counted)\n"
  assert not os.path.exists(tmp_path / "run")


def _config(tmp_path, path, **extra):
  overrides = {"data.source": f"jsonl:{path}", "train.run_dir": str(tmp_path / "run"), **extra}
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "base.py"),
                                   list(overrides.items()))


def test_resume_on_changed_data_is_refused_unless_overridden(tmp_path):
  path = _write(tmp_path / "d.jsonl", GOOD)
  with run_dir_lib.claimed(_config(tmp_path, path)):
    pass
  saved = json.load(open(tmp_path / "run" / "data.json"))
  content = open(path, "rb").read()
  assert saved["sha256"] == hashlib.sha256(b"d.jsonl\0" + content).hexdigest()  # name + bytes
  with run_dir_lib.claimed(_config(tmp_path, path, **{"train.resume": "true"})):
    pass  # the same file resumes
  _write(tmp_path / "d.jsonl", GOOD[:-1])
  with pytest.raises(run_dir_lib.RunDirError,
                     match=r"cannot resume .*run: its data changed \(data.source='jsonl:.*"
                           r"d.jsonl', sha256 .*resume_override=\"\('data.source',\)\""):
    with run_dir_lib.claimed(_config(tmp_path, path, **{"train.resume": "true"})):
      pass
  assert not os.path.exists(tmp_path / "run" / "run.lock")
  override = {"train.resume": "true", "train.resume_override": "('data.source',)"}
  with run_dir_lib.claimed(_config(tmp_path, path, **override)):
    pass
  assert json.load(open(tmp_path / "run" / "data.json"))["sha256"] != saved["sha256"]

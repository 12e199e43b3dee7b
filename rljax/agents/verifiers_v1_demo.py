"""``vf1_reverse_letters``: the verifiers v1 taskset ``reverse_letters``
(``configs/verifiers_v1/reverse_letters``: reverse a short string, reward the ``difflib`` ratio of
the reply) played through the endpoint, the environment of ``configs/tasks/verifiers.py``.

The library runs in the repository's ``.venv-verifiers`` (``scripts/bootstrap.sh``) behind the
bridge (``rljax.agents.verifiers_v1``), which imports the taskset from ``configs/verifiers_v1``;
a rljax problem (a row of ``configs/data/reverse_letters.jsonl``, the taskset's own rows) is its
task data as it is: the prompt and its reversal.
"""
from __future__ import annotations

import os

from rljax.agents.harness import register_harness
from rljax.agents.verifiers_v1 import verifiers_v1_harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, ".venv-verifiers", "bin", "python")
TASKSETS = os.path.join(ROOT, "configs", "verifiers_v1")


def reverse_letters_data(problem) -> dict:
  """The taskset's ``TaskData`` fields of a row (its system prompt is the taskset's default)."""
  return {"prompt": problem.prompt, "answer": problem.answer}


register_harness("vf1_reverse_letters")(verifiers_v1_harness(
    taskset="reverse_letters", python=PYTHON, python_path=TASKSETS,
    task_data=reverse_letters_data))

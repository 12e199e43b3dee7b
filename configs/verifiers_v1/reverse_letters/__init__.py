"""reverse_letters: a verifiers v1 taskset (``verifiers>=0.4``) that rljax ships for
``configs/tasks/verifiers.py``: reverse a short lowercase string, single-turn.

Written as the library's own example ``reverse_text`` (tests/agents/vf1_envs) with two changes
that let a fresh tiny policy learn it with no cold start: the reward is the ``difflib`` ratio of
the whole reply (stripped) against the reversal, with no answer tags to discover first (a
random policy's reply already shares a letter or two, so GRPO has groups with a signal from the
first step), and the rows are the embedded ``configs/data/reverse_letters.jsonl`` (1000 strings
of 3-6 letters, no download), the same file rljax reads as ``data.source`` so both sides name
the same tasks. Runs in the verifiers environment (``.venv-verifiers``) only, imported by the
bridge from ``configs/verifiers_v1`` (``rljax/agents/verifiers_v1_demo.py``).
"""
import json
import os
from difflib import SequenceMatcher

import verifiers.v1 as vf

SYSTEM = "Reverse the text."
ROWS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                    "reverse_letters.jsonl")


class ReverseLettersData(vf.TaskData):
  system_prompt: str | None = SYSTEM
  answer: str
  """The prompt reversed."""


class ReverseLettersTask(vf.Task[ReverseLettersData]):
  @vf.stop
  async def single_turn(self, trace: vf.Trace) -> bool:
    return trace.num_turns >= 1

  @vf.reward(weight=1.0)
  async def similarity(self, trace: vf.Trace) -> float:
    return SequenceMatcher(None, (trace.last_reply or "").strip(), self.data.answer).ratio()


class ReverseLettersConfig(vf.TasksetConfig):
  rows: str = ROWS


class ReverseLettersTaskset(vf.Taskset[ReverseLettersTask, ReverseLettersConfig]):
  def load(self) -> list[ReverseLettersTask]:
    with open(self.config.rows) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    return [ReverseLettersTask(ReverseLettersData(idx=i, prompt=r["prompt"], answer=r["answer"]),
                               self.config.task) for i, r in enumerate(rows)]


__all__ = ["ReverseLettersTaskset"]

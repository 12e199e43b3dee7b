"""The RLHF demo's hidden gold scorer (docs/reward_models.md, ``configs/tasks/rlhf.py``).

On an embedded task the gold score of a completion is its correctness plus a preference the
verifier alone does not see, brevity:

  gold = correct - BREVITY * |o|          (|o|: the completion's length in tokens, EOS included)

It labels preference pairs (``preference_pairs``: for ``rljax rm``) and is logged during RL as
the reward source ``gold`` (weight 0 in the demo: logged, not optimised), so the proxy reward (a
reward model trained on its pairs) can be compared with it as the policy moves away from its
start (Gao, Schulman, Hilton 2022, arXiv 2210.10760).
"""
from __future__ import annotations

import itertools
import json
import os
import random
from typing import Iterable, Iterator

import numpy as np

from rljax.data.tasks import MARKER, Problem, make_task
from rljax.errors import StartupError
from rljax.config.sources import parse_source
from rljax.rewards.reward_model import EXPORT_DIR, SOURCE_KEY
from rljax.rewards.sources import RewardBatch, Scored, register_reward_source

BREVITY = 0.02  # gold lost per completion token: a 20-token chain of thought costs 0.4


def gold_score(correct: bool, num_tokens: int) -> float:
  """``correct - BREVITY * num_tokens`` (module doc)."""
  return float(correct) - BREVITY * float(num_tokens)


def is_correct(completion: str, problem: Problem) -> bool:
  """The embedded task's own verdict (its verifier, in process: the gold scorer is trusted)."""
  task = make_task(problem.meta["task"], problem.meta.get("difficulty", 1))
  return bool(task.verify(completion, problem))


def _wrong(answer: str, rng: random.Random) -> str:
  try:
    return str(int(answer) + rng.choice((-2, -1, 1, 2, 10)))
  except ValueError:
    return answer + "0"


def candidates(problem: Problem, rng: random.Random) -> list[str]:
  """Responses of every kind the gold scorer tells apart: the reference chain of thought and the
  bare answer, each right and wrong, and a chain of thought cut after its first step."""
  answer, wrong = problem.answer, _wrong(problem.answer, rng)
  steps = problem.solution.rpartition(MARKER)[0].strip()
  first = steps.split(",")[0]
  return [problem.solution, f"{MARKER}{answer}", f"{steps} {MARKER}{wrong}",
          f"{MARKER}{wrong}", f"{first} {MARKER}{answer}", f"{first} {MARKER}{wrong}"]


def preference_pairs(problems: Iterable[Problem], tokenizer, per_problem: int,
                     seed: int) -> Iterator[dict]:
  """``{"prompt", "chosen", "rejected"}`` pairs labelled by ``gold_score`` (lengths in tokens
  of ``tokenizer``, EOS included): ``per_problem`` random pairs of ``candidates`` per problem
  whose gold scores differ, the higher one chosen."""
  rng = random.Random(seed)
  for problem in problems:
    scored = []
    for text in dict.fromkeys(candidates(problem, rng)):  # distinct, in order
      n = len(tokenizer.encode(text)) + 1
      scored.append((gold_score(is_correct(text, problem), n), text))
    pairs = [(a, b) for a, b in itertools.combinations(scored, 2) if a[0] != b[0]]
    for a, b in rng.sample(pairs, min(per_problem, len(pairs))):
      chosen, rejected = (a, b) if a[0] > b[0] else (b, a)
      yield {"prompt": problem.prompt, "chosen": chosen[1], "rejected": rejected[1]}


PAIRS_PER_PROBLEM = 4


def write_pairs(path: str, task: str, difficulty: int, tokenizer, *, num_pairs: int,
                seed: int) -> int:
  """Writes ``num_pairs`` gold-labelled pairs (``PAIRS_PER_PROBLEM`` per training problem of the
  embedded ``task``, in stream order) to the JSONL file ``path``, atomically; returns how many."""
  stream = make_task(task, difficulty).train_stream(seed)
  pairs = itertools.islice(preference_pairs(stream, tokenizer, PAIRS_PER_PROBLEM, seed),
                           num_pairs)
  lines = [json.dumps(p) for p in pairs]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  staging = f"{path}.tmp{os.getpid()}"
  with open(staging, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  os.replace(staging, path)
  return len(lines)


def reward_model_dir(config) -> str:
  """The run directory ``DIR`` of ``reward.model.source='run:DIR'``, where the demo's cold start
  (``reward.gold.pairs``, ``rljax.train.rlhf``) trains the reward model: it needs that form."""
  text = config.reward.model.source
  source = parse_source(text, SOURCE_KEY) if text else None
  if source is None or source.kind != "run" or source.step is not None:
    raise StartupError(f"reward.gold.pairs={config.reward.gold.pairs} trains the reward model "
                       f"first: {SOURCE_KEY} must be 'run:DIR' (where it is trained), got {text!r}")
  return source.path


def cold_start_pending(config) -> bool:
  """Whether the run trains its reward model first: ``reward.gold.pairs > 0`` and the
  reward model's run directory holds no export yet (its files are checked after that)."""
  if not config.reward.gold.pairs:
    return False
  return not os.path.isfile(os.path.join(reward_model_dir(config), EXPORT_DIR, "config.json"))


@register_reward_source("gold", reads=("reward.gold.pairs",))
def gold_source(config, tokenizer, model_cfg, mesh):
  """The RLHF demo's hidden gold score (``rljax.rewards.gold``): correctness by the embedded
  task's verifier minus ``BREVITY`` per completion token (EOS included); embedded problems
  only."""
  if not config.data.source.startswith("embedded:"):
    raise StartupError(f"reward source 'gold' scores embedded tasks only; data.source="
                       f"{config.data.source!r}")

  def score(batch: RewardBatch) -> Scored:
    lengths = np.asarray(batch.mask).sum(axis=1)
    return Scored(np.asarray([gold_score(is_correct(c, p), n) for c, p, n in
                              zip(batch.completions, batch.problems, lengths)], np.float32))
  return score

"""Preference pairs for reward-model training (``rljax rm``): JSONL, one object per line with
string fields ``prompt``, ``chosen`` and ``rejected`` (the preferred and the other response to
the prompt). A line that is not such an object is a ``DataError`` naming file and line."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from rljax.errors import DataError, DataFileNotFoundError

FIELDS = ("prompt", "chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class Pair:
  """One preference: ``chosen`` is preferred to ``rejected`` as a response to ``prompt``."""
  prompt: str
  chosen: str
  rejected: str
  where: str = ""  # 'file:line', for messages


def read_pairs(path: str, key: str = "rm.train_file") -> list[Pair]:
  """Every pair of the JSONL file ``path`` (``key``: the config key naming it, for messages)."""
  if not os.path.isfile(path):
    raise DataFileNotFoundError(f"{key}={path!r} is not a file")
  pairs = []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      where = f"{path}:{number}"
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError:
        raise DataError(f"{where}: not UTF-8 text") from None
      if not text.strip():
        continue
      try:
        record = json.loads(text)
      except ValueError as e:
        raise DataError(f"{where}: not valid JSON ({getattr(e, 'msg', e)})") from None
      if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object with {FIELDS}, got "
                        f"{type(record).__name__}")
      for field in FIELDS:
        if not isinstance(record.get(field), str):
          found = "missing" if field not in record else f"{record[field]!r}, not a string"
          raise DataError(f"{where}: field {field!r} is {found} (a preference pair has string "
                          f"fields {FIELDS})")
      pairs.append(Pair(record["prompt"], record["chosen"], record["rejected"], where))
  if not pairs:
    raise DataError(f"{key}={path!r} holds no preference pair")
  return pairs


def split_pairs(pairs: list[Pair], eval_fraction: float, seed: int) -> tuple[list, list]:
  """(train, held-out): a ``seed``-shuffled ``eval_fraction`` of ``pairs`` (at least one) is held
  out; both parts non-empty."""
  if len(pairs) < 2:
    raise DataError(f"{len(pairs)} preference pair cannot be split into training and held-out "
                    "pairs: give more, or rm.eval_file")
  order = np.random.default_rng(seed).permutation(len(pairs))
  held = min(max(1, int(round(eval_fraction * len(pairs)))), len(pairs) - 1)
  return [pairs[i] for i in order[held:]], [pairs[i] for i in order[:held]]


def batch_indices(num_pairs: int, batch: int, step: int, seed: int) -> np.ndarray:
  """Pair indices [batch] of training step ``step``: epochs of ``seed``-shuffled orders laid end
  to end, so that step ``s`` draws the same pairs whether the run was resumed or not."""
  start = step * batch
  out = []
  epoch = start // num_pairs
  offset = start % num_pairs
  while len(out) < batch:
    order = np.random.default_rng([seed, epoch]).permutation(num_pairs)
    take = order[offset:offset + batch - len(out)]
    out.extend(take.tolist())
    epoch, offset = epoch + 1, 0
  return np.asarray(out, np.int64)

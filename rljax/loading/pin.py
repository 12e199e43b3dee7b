"""The frozen base of a policy with adapters, pinned when its run starts.

A run with ``model.lora.rank > 0`` checkpoints its adapters only; the base is read again from
``model.source`` at every resume, eval and convert. A 'run:DIR' base would then be DIR's latest
checkpoint *at that moment*: once DIR trains further, the same adapters would land on another
base. So the run records, in its run directory (``lora_base.json``) and in every checkpoint
(``extra['lora_base']``), the source, the adapters' settings and, for a 'run:DIR' source, the
checkpoint step it started from and a fingerprint of those weights (sha256 of every array); a
later read takes that step and refuses weights whose fingerprint differs.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

import jax
import numpy as np

from rljax.config.sources import parse_source
from rljax.errors import RunDirError

RECORD_FILE = "lora_base.json"  # in the run directory


def fingerprint(params: Any) -> str:
  """sha256 of every array of ``params`` (path, dtype, shape, bytes), in path order."""
  digest = hashlib.sha256()
  for path, x in sorted(jax.tree_util.tree_flatten_with_path(params)[0],
                        key=lambda item: jax.tree_util.keystr(item[0])):
    x = np.ascontiguousarray(np.asarray(x))
    digest.update(f"{jax.tree_util.keystr(path)}:{x.dtype}:{x.shape}".encode())
    digest.update(x.tobytes())
  return digest.hexdigest()


def base_record(config, step: Optional[int] = None, base: Any = None) -> dict:
  """What a run with adapters records about their base: its source and the adapters' settings;
  for a 'run:DIR' source the ``step`` it was read at and the ``fingerprint`` of ``base``."""
  m = config.model
  record = {"source": m.source, "rank": m.lora.rank, "alpha": float(m.lora.alpha),
            "targets": list(m.lora.targets)}
  if step is not None:
    record.update(step=int(step), fingerprint=fingerprint(base))
  return record


def pinned_source(config, record: Optional[dict]) -> str:
  """The base's source as pinned: 'run:DIR@STEP' for a 'run:DIR' base recorded at ``STEP``,
  else ``model.source``."""
  text = config.model.source
  if record and record.get("step") is not None:
    source = parse_source(text)
    if source.kind == "run":
      return f"run:{source.path}@{int(record['step'])}"
  return text


def check_fingerprint(record: Optional[dict], base: Any, source: str) -> None:
  """The base read now is the one the adapters were trained on (``record['fingerprint']``)."""
  want = (record or {}).get("fingerprint")
  if want and fingerprint(base) != want:
    raise RunDirError(f"the adapters' base model.source={source!r} at step {record.get('step')} "
                      "is not the one they were trained on (its weights' fingerprint differs): "
                      "its checkpoint was replaced")


def check_record(config, extra: dict, what: str) -> Optional[dict]:
  """The adapters of a checkpoint (``extra['lora_base']``) were trained on ``config``'s base: a
  checkpoint of adapters restored onto another base is refused in one line. Returns the record."""
  saved = extra.get("lora_base")
  if saved is None:
    return None
  if saved.get("source") != config.model.source:
    raise RunDirError(
        f"{what}: its adapters were trained on model.source={saved.get('source')!r}, not on "
        f"model.source={config.model.source!r}; adapters of another base do not apply")
  return saved


def write(run_dir: str, record: dict) -> None:
  os.makedirs(run_dir, exist_ok=True)
  with open(os.path.join(run_dir, RECORD_FILE), "w") as f:
    json.dump(record, f, indent=2)


def read(run_dir: str) -> Optional[dict]:
  path = os.path.join(run_dir, RECORD_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)

"""Metrics sinks of the RL loop: loggers behind one protocol, and a live progress bar.

``MetricsWriter`` sends every record to the run's loggers (``Logger``): a JSON-lines file and
TensorBoard here, W&B and MLflow in ``rljax.runs.trackers`` (``train.loggers``).

``run_dir/metrics.jsonl`` holds one JSON object per ``write`` call: ``{"step": int, key: float,
...}``. Non-finite values (NaN, +-inf) are written as ``null`` because ``NaN`` is not JSON and
strict parsers (jq, JavaScript) reject it; a reader sees ``None`` for them. A step may have several
lines (e.g. train metrics, then the final eval at the same step). Named side streams
(``write_named('pretrain', ...)``) go to ``run_dir/<name>.jsonl`` and the TensorBoard run
``run_dir/tb/<name>``.

Resuming: ``start_step`` tells the writer where the run starts. 0 is a fresh run: existing files
are replaced. ``s > 0`` resumes from checkpoint ``s``: the main stream keeps the records before
step ``s`` and the *first* record at step ``s`` (the step's own record, written before its
checkpoint was saved); everything after it (later steps, and the final eval written at step ``s``
by a run that finished or was killed during its final export) is about to be written again and is
dropped. TensorBoard purges its events after ``s``. So the finished file equals an uninterrupted
run's record for record, however often the run was killed and resumed.

``evals.csv``: the eval records of ``metrics.jsonl`` as a table (``write_eval_table``), one row
per eval step, written with ``curves.png`` when a run finishes.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import sys
from typing import Any, Callable, Iterable, Mapping, Protocol

import numpy as np
from tqdm.auto import tqdm

DEFAULT_POSTFIX = ("reward_mean", "accuracy", "entropy", "kl", "len_mean", "sec_step")
MAIN = "metrics"  # the main stream: run_dir/metrics.jsonl, TensorBoard run_dir/tb


class Logger(Protocol):
  """Where a run's records go (JSON lines, TensorBoard, ``rljax.runs.trackers``' W&B and
  MLflow). ``MetricsWriter`` calls it on the main process only, with finite-or-not python floats.

  ``log``: one record of ``stream`` (``MAIN``, or a side stream such as ``'pretrain'``) at
  ``step``. ``log_config``: the resolved config (nested dict), once at start. ``log_artifact``: a
  finished file of the run (``curves.png``, ``evals.csv``). ``close``: flush and release.
  """

  def log(self, step: int, metrics: Mapping[str, float], stream: str = MAIN) -> None: ...

  def log_config(self, config: Mapping[str, Any]) -> None: ...

  def log_artifact(self, path: str) -> None: ...

  def close(self) -> None: ...


class JsonlLogger:
  """``run_dir/<stream>.jsonl``: the run's own record (module docstring), read back by resumes,
  ``curves.png``, sweeps and ``rljax eval``. The config is ``config.json`` (written when the run
  dir is claimed) and artifacts are files of the run dir already, so both are no-ops here."""

  def __init__(self, run_dir: str, start_step: int | None = None):
    self.run_dir, self.start_step = run_dir, start_step
    self._files: dict = {}
    self._open(MAIN)

  def _open(self, stream: str):
    """The stream's file, opened (and cut back) on first use. The main stream shares its step
    axis with the checkpoints, so a resume cuts it after ``start_step``; side streams (critic
    pre-training) do not: they are kept unless the run is fresh."""
    if stream not in self._files:
      fresh = self.start_step == 0
      path = os.path.join(self.run_dir, f"{stream}.jsonl")
      if os.path.exists(path):
        if fresh:
          os.remove(path)  # a run starting from step 0 rewrites everything
        else:  # also repairs a torn last line
          truncate_jsonl(path, keep_through=self.start_step if stream == MAIN else None)
      self._files[stream] = open(path, "a", encoding="utf-8")
    return self._files[stream]

  def log(self, step: int, metrics: Mapping[str, float], stream: str = MAIN) -> None:
    record = {"step": int(step),
              **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
    handle = self._open(stream)
    # One write call per line, flushed: a kill leaves at most one torn last line, which the next
    # reader or writer drops.
    handle.write(json.dumps(record, allow_nan=False) + "\n")
    handle.flush()

  def log_config(self, config: Mapping[str, Any]) -> None:
    pass

  def log_artifact(self, path: str) -> None:
    pass

  def close(self) -> None:
    for handle in self._files.values():
      handle.close()
    self._files.clear()


class TensorBoardLogger:
  """``run_dir/tb`` (main stream) and ``run_dir/tb/<stream>``: each stream has its own directory
  because a purge hides every tag of a directory. A resume purges the main stream's events after
  ``start_step``, as the JSON-lines truncation does. Config and artifacts are not sent: they are
  files of the run dir."""

  def __init__(self, run_dir: str, start_step: int | None = None):
    self.run_dir, self.start_step = run_dir, start_step
    self._writers: dict = {}
    self._open(MAIN)

  def _open(self, stream: str):
    if stream not in self._writers:
      fresh = self.start_step == 0
      keep_through = self.start_step if stream == MAIN and not fresh else None
      purge = 0 if fresh else (None if keep_through is None else keep_through + 1)
      logdir = os.path.join(self.run_dir, "tb", "" if stream == MAIN else stream)
      self._writers[stream] = _summary_writer(logdir, purge)
    return self._writers[stream]

  def log(self, step: int, metrics: Mapping[str, float], stream: str = MAIN) -> None:
    writer = self._open(stream)
    for key, value in metrics.items():
      writer.add_scalar(key, value, int(step))
    writer.flush()

  def log_config(self, config: Mapping[str, Any]) -> None:
    pass

  def log_artifact(self, path: str) -> None:
    pass

  def close(self) -> None:
    for writer in self._writers.values():
      writer.close()
    self._writers.clear()


def default_loggers(run_dir: str, start_step: int | None) -> list:
  """Today's sinks: JSON lines and TensorBoard."""
  return [JsonlLogger(run_dir, start_step), TensorBoardLogger(run_dir, start_step)]


class MetricsWriter:
  """Sends per-step scalars to the run's loggers and shows progress.

  Args:
    run_dir: the run's directory (created on demand).
    enabled: False on non-main processes: nothing is written or shown there.
    progress_total: number of steps for the bar (None: unknown).
    progress: show the live progress bar.
    start_step: where this run starts (module docstring); None leaves existing files as they are
      and appends to them.
    postfix_keys: metrics shown in the bar's postfix when present.
    loggers: ``(run_dir, start_step) -> [Logger, ...]``, called on the main process only
      (default: JSON lines and TensorBoard; ``rljax.runs.trackers.factory`` adds W&B/MLflow).
  """

  def __init__(self, run_dir: str, *, enabled: bool, progress_total: int | None,
               progress: bool, start_step: int | None = None,
               postfix_keys: Iterable[str] = DEFAULT_POSTFIX,
               loggers: Callable[[str, int | None], list] = default_loggers):
    self.run_dir = run_dir
    self.enabled = enabled
    self.start_step = start_step
    self.postfix_keys = tuple(postfix_keys)
    self.loggers: list = []
    self._bar = None
    if not enabled:
      return
    os.makedirs(run_dir, exist_ok=True)
    self.loggers = list(loggers(run_dir, start_step))
    if progress:
      self._bar = _progress_bar(progress_total, start_step or 0)

  # --- writing ----------------------------------------------------------------------------

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Record ``metrics`` (scalars) at ``step`` in every logger and move the progress bar.

    ``step`` counts completed updates; the bar moves to it."""
    if not self.enabled:
      return
    values = _floats(metrics)
    for logger in self.loggers:
      logger.log(step, values)
    if self._bar is not None:
      self._advance(step, values)

  def write_named(self, name: str, step: int, metrics: Mapping[str, Any]) -> None:
    """Record a side stream (e.g. critic pre-training: ``<name>.jsonl``, ``tb/<name>``); the
    progress bar does not move."""
    if not self.enabled:
      return
    if not name.isidentifier() or name == MAIN:
      raise ValueError(f"write_named: stream name must be an identifier other than {MAIN!r}, "
                       f"got {name!r}")
    values = _floats(metrics)
    for logger in self.loggers:
      logger.log(step, values, stream=name)

  def log_config(self, config: Mapping[str, Any]) -> None:
    """The resolved config (a nested dict), to every logger; once, at the start of a run."""
    for logger in self.loggers:
      logger.log_config(config)

  def log_artifact(self, path: str) -> None:
    """A finished file of the run (``curves.png``, ``evals.csv``), to every logger."""
    for logger in self.loggers:
      logger.log_artifact(path)

  def _advance(self, step: int, values: dict[str, float]) -> None:
    """Move the bar forward to ``step`` and show the key figures."""
    if step > self._bar.n:
      self._bar.update(step - self._bar.n)
    shown = {k: f"{values[k]:.4g}" for k in self.postfix_keys if k in values}
    if shown:
      self._bar.set_postfix(shown, refresh=True)

  def log(self, text: str) -> None:
    """Print a line above the progress bar (plain print when there is none)."""
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.write(text)
    else:
      print(text, flush=True)

  def close(self) -> None:
    """Flush and close every logger and the bar (idempotent)."""
    loggers, self.loggers = self.loggers, []
    for logger in loggers:
      logger.close()
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# --- reading and reducing ------------------------------------------------------------------------

def read_jsonl(path: str) -> list[dict]:
  """The records of a JSON-lines file; a torn last line (no newline: a kill mid-write) is skipped,
  any other bad line raises ValueError naming its line number."""
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.endswith("\n"):
        break  # torn last line
      if line.strip():
        try:
          records.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{number}: not JSON ({e})") from None
  return records


def truncate_jsonl(path: str, *, keep_through: int | None) -> None:
  """Rewrite ``path`` keeping the records with ``step < keep_through`` and the first one with
  ``step == keep_through`` (None: all), dropping a torn last line. The rewrite goes through a
  temporary file and ``os.replace``: atomic."""
  records = read_jsonl(path)
  if keep_through is not None:
    kept, seen_last = [], False
    for r in records:
      if r["step"] < keep_through or (r["step"] == keep_through and not seen_last):
        kept.append(r)
        seen_last = seen_last or r["step"] == keep_through
    records = kept
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in records)
  os.replace(tmp, path)


def summarize(values: Mapping[str, Any]) -> dict[str, float]:
  """``{key: (sum, count)} -> {key: sum / count}``; keys with count 0 (nothing measured, e.g. no
  KL tokens) are left out rather than reported as NaN or 0."""
  out = {}
  for key, pair in values.items():
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
      raise TypeError(f"summarize: {key!r} must be a (sum, count) pair, got {type(pair).__name__}")
    total, count = float(np.asarray(pair[0])), float(np.asarray(pair[1]))
    if count != 0:
      out[key] = total / count
  return out


def is_timing(key: str) -> bool:
  """A wall-clock metric (``sec_*``, ``*_sec``, ``tokens_per_sec``): it differs from run to run,
  so records that must agree number for number (a resumed run, a rerun) are compared without it."""
  return key.startswith("sec_") or key.endswith("_sec") or key == "tokens_per_sec"


def without_timing(record: Mapping[str, Any]) -> dict:
  """``record`` without its wall-clock metrics (``is_timing``)."""
  return {k: v for k, v in record.items() if not is_timing(k)}


def eval_table(records: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[list]]:
  """``(columns, rows)`` of the eval records (those with an ``eval_*`` key): ``step`` and every
  ``eval_*`` key any of them holds, sorted; one row per record, ``None`` where it lacks a key."""
  evals = [r for r in records if any(k.startswith("eval_") for k in r)]
  keys = sorted({k for r in evals for k in r if k.startswith("eval_")})
  return ["step", *keys], [[r["step"], *(r.get(k) for k in keys)] for r in evals]


def write_eval_table(jsonl_path: str, csv_path: str) -> None:
  """``eval_table`` of a JSON-lines file as CSV (null values as empty cells)."""
  columns, rows = eval_table(read_jsonl(jsonl_path))
  with open(csv_path, "w", newline="", encoding="utf-8") as f:
    out = csv.writer(f)
    out.writerow(columns)
    out.writerows([["" if v is None else v for v in row] for row in rows])


# --- helpers ------------------------------------------------------------------------------------

def _floats(metrics: Mapping[str, Any]) -> dict[str, float]:
  """Metrics as python floats (jax/numpy scalars included); raises TypeError naming a bad key."""
  out = {}
  for key, value in metrics.items():
    if key == "step":
      raise ValueError("metrics must not contain 'step': it is the write() argument")
    try:
      out[key] = float(np.asarray(value))
    except (TypeError, ValueError):
      raise TypeError(f"metric {key!r} is not a scalar number: {value!r}") from None
  return out


def _summary_writer(logdir: str, purge_step: int | None):
  """tensorboardX writer. ``purge_step`` makes TensorBoard hide the events of earlier runs in the
  same directory from that step on, as the JSON-lines truncation does."""
  with _torch_hidden():
    from tensorboardX import SummaryWriter  # heavy import, only on the main process
  return SummaryWriter(logdir, purge_step=purge_step, flush_secs=30)


@contextlib.contextmanager
def _torch_hidden():
  """Within the block ``import torch`` fails unless torch is imported already. tensorboardX's
  writer imports torch, where it is installed, only to name ``torch.Tensor`` in its type hints;
  a scalar logger never needs it, and the import costs every run's start ~2.5 s (torch 2.x on
  CPU). Nothing of tensorboardX remembers that torch was missing: a later import (a Hugging Face
  export) finds it."""
  if "torch" in sys.modules or "tensorboardX" in sys.modules:  # nothing left to import
    yield
    return
  sys.modules["torch"] = None  # the import system's mark for "not importable"
  try:
    yield
  finally:
    if sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]


def _progress_bar(total: int | None, initial: int):
  return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, smoothing=0.1)

"""Metrics sinks of the RL loop: a JSON-lines file, TensorBoard, and a live progress bar.

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
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Mapping

import numpy as np
from tqdm.auto import tqdm

DEFAULT_POSTFIX = ("reward_mean", "accuracy", "entropy", "kl", "len_mean", "sec_step")
MAIN = "metrics"  # the main stream: run_dir/metrics.jsonl, TensorBoard run_dir/tb


class MetricsWriter:
  """Writes per-step scalars to ``run_dir`` and shows progress.

  Args:
    run_dir: the run's directory (created on demand).
    enabled: False on non-main processes: nothing is written or shown there.
    progress_total: number of steps for the bar (None: unknown).
    progress: show the live progress bar.
    start_step: where this run starts (module docstring); None leaves existing files as they are
      and appends to them.
    postfix_keys: metrics shown in the bar's postfix when present.
  """

  def __init__(self, run_dir: str, *, enabled: bool, progress_total: int | None,
               progress: bool, start_step: int | None = None,
               postfix_keys: Iterable[str] = DEFAULT_POSTFIX):
    self.run_dir = run_dir
    self.enabled = enabled
    self.start_step = start_step
    self.postfix_keys = tuple(postfix_keys)
    self._streams: dict[str, _Stream] = {}
    self._bar = None
    if not enabled:
      return
    os.makedirs(run_dir, exist_ok=True)
    self._stream(MAIN)
    if progress:
      self._bar = _progress_bar(progress_total, start_step or 0)

  def _stream(self, name: str) -> "_Stream":
    """The JSON-lines file and TensorBoard writer of a stream, opened (and cut back) on first use.

    The main stream shares its step axis with the checkpoints, so a resume cuts it after
    ``start_step``. Side streams (critic pre-training) do not: they are kept unless the run is
    fresh. Each stream has its own TensorBoard directory because a purge hides every tag of a
    directory.
    """
    if name not in self._streams:
      fresh = self.start_step == 0
      keep_through = self.start_step if name == MAIN and not fresh else None
      path = os.path.join(self.run_dir, f"{name}.jsonl")
      if os.path.exists(path):
        if fresh:
          os.remove(path)  # a run starting from step 0 rewrites everything
        else:
          truncate_jsonl(path, keep_through=keep_through)  # also repairs a torn last line
      purge = 0 if fresh else (None if keep_through is None else keep_through + 1)
      logdir = os.path.join(self.run_dir, "tb", "" if name == MAIN else name)
      self._streams[name] = _Stream(open(path, "a", encoding="utf-8"),
                                    _summary_writer(logdir, purge))
    return self._streams[name]

  # --- writing ----------------------------------------------------------------------------

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Record ``metrics`` (scalars) at ``step``: one JSON line, TensorBoard, progress bar.

    ``step`` counts completed updates; the bar moves to it."""
    if not self.enabled:
      return
    values = _floats(metrics)
    self._stream(MAIN).write(step, values)
    if self._bar is not None:
      self._advance(step, values)

  def write_named(self, name: str, step: int, metrics: Mapping[str, Any]) -> None:
    """Record a side stream (e.g. critic pre-training) in ``<name>.jsonl`` and ``tb/<name>``;
    the progress bar does not move."""
    if not self.enabled:
      return
    if not name.isidentifier() or name == MAIN:
      raise ValueError(f"write_named: stream name must be an identifier other than {MAIN!r}, "
                       f"got {name!r}")
    self._stream(name).write(step, _floats(metrics))

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
    """Flush and close files, TensorBoard and the bar (idempotent)."""
    for stream in self._streams.values():
      stream.close()
    self._streams.clear()
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _Stream:
  """One JSON-lines file plus its TensorBoard writer."""

  def __init__(self, handle, tb):
    self.handle, self.tb = handle, tb

  def write(self, step: int, values: dict[str, float]) -> None:
    record = {"step": int(step),
              **{k: (v if math.isfinite(v) else None) for k, v in values.items()}}
    # One write call per line, flushed: a kill leaves at most one torn last line, which the next
    # reader or writer drops.
    self.handle.write(json.dumps(record, allow_nan=False) + "\n")
    self.handle.flush()
    for key, value in values.items():
      self.tb.add_scalar(key, value, int(step))
    self.tb.flush()

  def close(self) -> None:
    self.handle.close()
    self.tb.close()


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
  from tensorboardX import SummaryWriter  # heavy import, only on the main process
  return SummaryWriter(logdir, purge_step=purge_step, flush_secs=30)


def _progress_bar(total: int | None, initial: int):
  return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, smoothing=0.1)

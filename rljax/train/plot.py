"""Training curves from ``metrics.jsonl``: one run, or several runs overlaid (README comparisons).

Figures are drawn on a bare ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot global
state, so plotting works headless, from threads, and does not change a notebook's backend.
"""
from __future__ import annotations

import math
import os
from typing import Iterable, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rljax.train.metrics import read_jsonl

DEFAULT_KEYS = ("reward_mean", "eval_accuracy", "entropy", "len_mean")


def series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
  """``(steps, values)`` of ``key`` over records that hold a finite value for it, by step.

  A step logged twice for the same key keeps its last value (the later line wins, as on resume).
  Null values (non-finite when written) are left out.
  """
  by_step = {}
  for record in records:
    value = record.get(key)
    if value is not None:
      by_step[int(record["step"])] = float(value)
  steps = sorted(by_step)
  return steps, [by_step[s] for s in steps]


def _is_sparse(records: Sequence[dict], steps: Sequence[int]) -> bool:
  """Whether a key is logged on few steps (evals): drawn with markers so single points show."""
  logged = {r["step"] for r in records}
  return len(steps) <= 1 or len(steps) * 2 < len(logged)


def _grid(num: int, width: float = 5.0, height: float = 3.2):
  """A figure with ``num`` axes in up to two columns, plus the axes list."""
  cols = min(2, max(num, 1))
  rows = max(1, math.ceil(num / cols))
  fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
  FigureCanvasAgg(fig)
  axes = [fig.add_subplot(rows, cols, i + 1) for i in range(max(num, 1))]
  return fig, axes


def _draw(ax, records: Sequence[dict], key: str, label: str | None = None,
          color: str | None = None) -> bool:
  """Draw ``key`` of one run on ``ax``; False when the run never logged it."""
  steps, values = series(records, key)
  if not steps:
    return False
  style = dict(marker="o", markersize=4) if _is_sparse(records, steps) else {}
  ax.plot(steps, values, label=label, color=color, **style)
  return True


def _save(fig: Figure, png_path: str) -> None:
  directory = os.path.dirname(os.path.abspath(png_path))
  os.makedirs(directory, exist_ok=True)
  fig.savefig(png_path, dpi=110)


def _empty(png_path: str, message: str) -> None:
  """Still write a PNG (the caller asked for a file) that says why it is empty."""
  fig, (ax,) = _grid(1)
  ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
  ax.set_axis_off()
  _save(fig, png_path)


def plot_run(jsonl_path: str, png_path: str, keys: Iterable[str] = DEFAULT_KEYS,
             title: str | None = None) -> list[str]:
  """One PNG with a subplot per key against step; keys the run never logged are skipped.

  Returns the keys plotted.
  """
  records = read_jsonl(jsonl_path)
  present = [k for k in keys if series(records, k)[0]]
  if not present:
    _empty(png_path, f"none of {list(keys)} in {os.path.basename(jsonl_path)}")
    return []
  fig, axes = _grid(len(present))
  for ax, key in zip(axes, present):
    _draw(ax, records, key)
    ax.set_title(key)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in axes[len(present):]:
    ax.set_axis_off()
  if title:
    fig.suptitle(title)
  _save(fig, png_path)
  return present


def plot_compare(runs: Mapping[str, str], png_path: str,
                 keys: Iterable[str] = DEFAULT_KEYS, title: str | None = None) -> list[str]:
  """Overlay several runs (``{label: jsonl_path}``) per key, e.g. dapo vs grpo vs dr_grpo.

  A key is plotted when at least one run logged it. Returns the keys plotted.
  """
  if not runs:
    raise ValueError("plot_compare: no runs given")
  records = {label: read_jsonl(path) for label, path in runs.items()}
  present = [k for k in keys if any(series(r, k)[0] for r in records.values())]
  if not present:
    _empty(png_path, f"none of {list(keys)} in any run")
    return []
  fig, axes = _grid(len(present))
  for ax, key in zip(axes, present):
    # A fixed colour per run: a run missing from one panel must not shift the others' colours.
    for i, (label, run_records) in enumerate(records.items()):
      _draw(ax, run_records, key, label=label, color=f"C{i % 10}")
    ax.set_title(key)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")  # every panel has a line: `present` requires one
  for ax in axes[len(present):]:
    ax.set_axis_off()
  if title:
    fig.suptitle(title)
  _save(fig, png_path)
  return present

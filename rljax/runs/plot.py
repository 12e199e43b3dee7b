"""Training curves from ``metrics.jsonl``: one run, or several runs overlaid (README comparisons).

Figures are drawn on a bare ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot global
state, so plotting works headless, from threads, and does not change a notebook's backend.
"""
from __future__ import annotations

import math
import os
from typing import Iterable, Mapping, Sequence

from rljax.runs.metrics import read_jsonl

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
  # matplotlib is imported here, when a figure is drawn: importing it costs every `rljax train`
  # process about a second at start-up, and a run draws only at its end.
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
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


def against(records: Sequence[dict], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
  """``(x, y)`` of the steps that logged both keys, in step order."""
  x_steps, xs = series(records, x_key)
  y_by_step = dict(zip(*series(records, y_key)))
  pairs = [(x, y_by_step[s]) for s, x in zip(x_steps, xs) if s in y_by_step]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def kl_trend(x: Sequence[float], y: Sequence[float]) -> tuple[list[float], list[float]]:
  """The points sorted by ``x``, both coordinates averaged over a window of ``max(1, n // 8)``
  neighbours (``n - w + 1`` points): the trend of a noisy per-step reward against the KL."""
  order = sorted(range(len(x)), key=lambda i: x[i])
  xs, ys = [x[i] for i in order], [y[i] for i in order]
  w = max(1, len(xs) // 8)
  mean = lambda v: [sum(v[j:j + w]) / w for j in range(len(v) - w + 1)]
  return mean(xs), mean(ys)


def plot_rewards_vs_kl(runs: Mapping[str, str], png_path: str, keys: Sequence[str],
                       kl_key: str = "kl", title: str | None = None) -> list[str]:
  """Reward over-optimisation (Gao, Schulman, Hilton 2022, arXiv 2210.10760): each reward key
  (e.g. the proxy ``reward/rm`` and the gold ``reward/gold``) against the KL from the initial
  policy (``kl``: the reference is the frozen start), one panel per key: each run's
  (``{label: jsonl_path}``) steps as points and their ``kl_trend`` as a line. Returns the keys
  plotted."""
  records = {label: read_jsonl(path) for label, path in runs.items()}
  present = [k for k in keys if any(against(r, kl_key, k)[0] for r in records.values())]
  if not present:
    _empty(png_path, f"none of {list(keys)} logged with {kl_key}")
    return []
  fig, axes = _grid(len(present))
  for ax, key in zip(axes, present):
    for i, (label, run_records) in enumerate(records.items()):
      x, y = against(run_records, kl_key, key)
      if x:  # every step a point; the line: the mean of KL-neighbouring steps (the trend)
        ax.scatter(x, y, s=9, alpha=0.5, color=f"C{i % 10}")
        ax.plot(*kl_trend(x, y), label=label, color=f"C{i % 10}")
    ax.set_title(key)
    ax.set_xlabel(f"{kl_key} (from the initial policy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
  for ax in axes[len(present):]:
    ax.set_axis_off()
  if title:
    fig.suptitle(title)
  _save(fig, png_path)
  return present

"""Study plots: each curve as the mean over seeds with a band, variants overlaid.

The band is the pointwise 95% Student t-interval of the mean over the seeds at that step (the
same interval as the tables; no band with one seed). Per-step train metrics are first smoothed
per run by a centred moving average over ``smooth_window(num_steps)`` steps, since one batch of
64 completions is noisy; the held-out eval curve is not smoothed. Steps are aligned across seeds
on the steps every seed logged.
"""
from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

import numpy as np

from rljax.sweep import aggregate

# The held-out curve of each run less its first eval (the cold start): seeds start from cold starts
# of different accuracy, so this band shows what training changed, which the plain one hides.
GAIN = "eval_accuracy_gain"

# (metric key in metrics.jsonl, or GAIN; panel title); panels whose key no run logged are left out.
CURVES = (
    ("eval_accuracy", "held-out accuracy (greedy)"),
    (GAIN, "held-out accuracy minus the run's step-0 eval"),
    ("accuracy", "train accuracy (sampled)"),
    ("entropy", "policy entropy (nats/token)"),
    ("len_mean", "completion length (tokens)"),
    ("len_correct_mean", "length of correct completions"),
    ("len_wrong_mean", "length of wrong completions"),
    ("truncation_rate", "truncation rate"),
    ("kl", "KL to the reference"),
    ("clip_frac_high", "fraction clipped above (ratio > 1 + eps_high)"),
    ("clip_frac_low", "fraction clipped below (ratio < 1 - eps_low)"),
)

# Fractions: their bands are cut to [0, 1] (a t-band over 2-3 seeds can reach past the range).
FRACTIONS = {"eval_accuracy", "accuracy", "truncation_rate", "clip_frac_high", "clip_frac_low"}


def smooth_window(num_steps: int) -> int:
  """Odd moving-average width: about 5% of the run, at least 1."""
  return max(1, (num_steps // 20) // 2 * 2 + 1)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
  """Centred moving average; the ends average over the part of the window that exists."""
  if window <= 1 or len(values) == 0:
    return values
  half = window // 2
  padded_sum = np.convolve(values, np.ones(window), mode="full")[half:half + len(values)]
  counts = np.convolve(np.ones_like(values), np.ones(window), mode="full")[half:half + len(values)]
  return padded_sum / counts


def seed_band(curves: Sequence[tuple[np.ndarray, np.ndarray]]):
  """(steps, mean, low, high) over the runs' (steps, values) on their common steps."""
  common = curves[0][0]
  for steps, _ in curves[1:]:
    common = np.intersect1d(common, steps)
  stacked = np.stack([values[np.searchsorted(steps, common)] for steps, values in curves])
  mean = stacked.mean(axis=0)
  n = stacked.shape[0]
  if n < 2:
    return common, mean, mean, mean
  half = aggregate.t_critical(n - 1) * stacked.std(axis=0, ddof=1) / math.sqrt(n)
  return common, mean, mean - half, mean + half


def _logged_key(key: str) -> str:
  return "eval_accuracy" if key == GAIN else key


def run_curve(records: Sequence[Mapping], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of one run's panel ``key``: evals as logged (``GAIN``: less the first eval),
  train metrics smoothed by ``moving_average``."""
  if key in ("eval_accuracy", GAIN):
    steps, values = aggregate.series(records, "eval_accuracy")
    return steps, (values - values[0] if key == GAIN and values.size else values)
  # Train metrics live on train records only (the eval-only records have no `accuracy`).
  steps, values = aggregate.series([r for r in records if "accuracy" in r], key)
  return steps, moving_average(values, smooth_window(len(values)))


def plot_study(records: Mapping[tuple[str, int], list], variants: Sequence[str], path: str,
               title: str) -> list[str]:
  """One PNG with a panel per logged curve; returns the metric keys drawn."""
  import matplotlib  # pyplot needs its backend chosen before it is first imported
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = [(key, label) for key, label in CURVES
            if any(aggregate.series(r, _logged_key(key))[0].size for r in records.values())]
  if not panels:
    raise ValueError(f"plot_study: no run logged any of {[k for k, _ in CURVES]}")
  cols = 2 if len(panels) > 1 else 1
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (key, label) in zip(axes.flat, panels):
    evals = key in ("eval_accuracy", GAIN)
    for i, variant in enumerate(variants):
      curves = [run_curve(recs, key) for (name, _), recs in sorted(records.items())
                if name == variant]
      curves = [c for c in curves if c[0].size]
      if not curves:
        continue
      steps, mean, low, high = seed_band(curves)
      color = colors[i % len(colors)]
      ax.plot(steps, mean, color=color, label=f"{variant} (n={len(curves)})",
              marker="o" if evals else None, markersize=3)
      if key in FRACTIONS:
        low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
      if len(curves) > 1:
        ax.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
    ax.set_title(label)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return [k for k, _ in panels]


def plot_overoptimization(records: Mapping[tuple[str, int], list], variants: Sequence[str],
                          path: str, proxy: str = "reward/rm", gold: str = "reward/gold",
                          kl: str = "kl", title: str = "") -> None:
  """Reward over-optimisation (Gao, Schulman, Hilton 2022, arXiv 2210.10760): two panels, the
  proxy reward and the gold reward against the KL from the initial policy, one line per variant:
  at each step the seed mean of the (smoothed, ``run_curve``) reward with its t-band against the
  seed mean of the KL."""
  import matplotlib  # pyplot needs its backend chosen before it is first imported
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, key in zip(axes.flat, (proxy, gold)):
    for i, variant in enumerate(variants):
      runs = [recs for (name, _), recs in sorted(records.items()) if name == variant]
      rewards = [c for c in (run_curve(r, key) for r in runs) if c[0].size]
      kls = [c for c in (run_curve(r, kl) for r in runs) if c[0].size]
      if not rewards or len(kls) != len(rewards):
        continue
      steps, mean, low, high = seed_band(rewards)
      kl_steps, kl_mean, _, _ = seed_band(kls)
      x = np.interp(steps, kl_steps, kl_mean)
      color = colors[i % len(colors)]
      ax.plot(x, mean, color=color, label=f"{variant} (n={len(rewards)})")
      if len(rewards) > 1:
        ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
    ax.set_title(f"{key} (proxy)" if key == proxy else f"{key} (gold)")
    ax.set_xlabel(f"{kl}: KL from the initial policy")
    ax.grid(alpha=0.3)
  axes.flat[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)

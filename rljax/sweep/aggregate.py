"""Aggregate a study from its runs' ``metrics.jsonl`` (and ``sweep_wall.json``): no re-running.

Per run (``run_summary``), from the records of ``rljax.runs.metrics``:

* ``final_accuracy``: the held-out greedy accuracy (``eval_accuracy``) of the last eval, at
  ``train.steps``; ``best_accuracy``: the largest ``eval_accuracy`` of the run, step 0 included;
  ``gain_accuracy``: the final minus the first eval (step 0: the cold start), what training added
  (over cold starts of several ``sft.seed``, its spread excludes how good each one was).
* ``auc_accuracy``: the area under the eval curve by the trapezoid rule over the eval steps,
  divided by the step range: ``sum_i (s_{i+1} - s_i) (a_i + a_{i+1}) / 2 / (s_last - s_first)``.
  It is the time-average accuracy over training, in the units of accuracy (a run flat at 0.4 has
  AUC 0.4), so it rewards learning early as well as ending high. One eval only: that eval.
* ``final_<x>``: the mean of the per-step train metric over the last ``FINAL_WINDOW`` of the train
  steps (at least one step), which averages out the step-to-step noise of one batch:
  ``final_entropy`` (``entropy``: mean token entropy of the batch under the policy),
  ``final_len_mean`` (``len_mean``), ``final_len_correct`` / ``final_len_wrong`` (``len_correct_mean``
  / ``len_wrong_mean``: mean completion length of the correct / wrong completions of the step),
  ``final_truncation_rate`` (``truncation_rate``); ``mean_truncation_rate`` is the mean over all
  train steps. A metric the run did not log (``len_correct_mean`` before the trainer logs it) is
  NaN and shows as "n/a".
* ``generated_samples``: the completions generated over all train steps (``generated_samples``
  per step: every round of dynamic sampling, the filtered-out groups included);
  ``gain_per_1k_samples``: ``gain_accuracy`` in points per 1,000 of them, the sample efficiency
  that dynamic sampling trades against steps.
* ``wall_time_s``: the summed wall time of the run's attempts (``sweep_wall.json``: the train
  subprocess, compilation and evals included, the shared SFT cold start not); NaN for runs the
  sweep did not launch (``--print-commands``).

Across seeds (``mean_ci``): the mean and a 95% Student t confidence interval,
``mean +- t_{0.975, n-1} * s / sqrt(n)`` with ``s`` the sample standard deviation (ddof=1).
Against the baseline (``paired_difference``): for every seed that both ran, ``d_k = x_k - b_k``;
the mean of ``d`` and its t-interval as above (paired by seed: both runs of a seed share the cold
start, the data order and the sampling seed, so the seed-to-seed spread cancels out). An interval
that excludes 0 is marked ``+`` or ``-``, else ``~`` (inconclusive at 95%).
"""
from __future__ import annotations

import csv
import math
import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from rljax.sweep import study as study_lib
from rljax.sweep import runner
from rljax.runs.metrics import read_jsonl

FINAL_WINDOW = 0.1  # fraction of the train steps that the final_* metrics average over
LEVEL = 0.95
_FINAL_KEYS = {"final_entropy": "entropy", "final_len_mean": "len_mean",
               "final_len_correct": "len_correct_mean", "final_len_wrong": "len_wrong_mean",
               "final_truncation_rate": "truncation_rate"}


# --- statistics ----------------------------------------------------------------------------------

def t_critical(df: int, level: float = LEVEL) -> float:
  """Two-sided Student t critical value ``t_{(1+level)/2, df}`` (4.303 for df=2 at 95%)."""
  if df < 1:
    raise ValueError(f"t_critical: df must be >= 1, got {df}")
  from scipy import stats  # a dependency of jax
  return float(stats.t.ppf(0.5 + level / 2, df))


def mean_ci(values: Iterable[float], level: float = LEVEL) -> tuple[int, float, float, float]:
  """(n, mean, low, high) of the finite ``values``: the Student t-interval of the mean. With one
  value the interval is (nan, nan); with none everything but n is nan."""
  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
  n = len(x)
  if n == 0:
    return 0, math.nan, math.nan, math.nan
  mean = float(x.mean())
  if n == 1:
    return 1, mean, math.nan, math.nan
  half = t_critical(n - 1, level) * float(x.std(ddof=1)) / math.sqrt(n)
  return n, mean, mean - half, mean + half


def paired_difference(values: Mapping[int, float], baseline: Mapping[int, float],
                      level: float = LEVEL) -> tuple[int, float, float, float]:
  """(n_pairs, mean, low, high) of ``values[k] - baseline[k]`` over the seeds ``k`` both have
  finite values for: the paired t-interval."""
  seeds = [k for k in values if k in baseline]
  return mean_ci([values[k] - baseline[k] for k in seeds
                  if math.isfinite(values[k]) and math.isfinite(baseline[k])], level)


def direction(low: float, high: float) -> str:
  """'+' if the interval lies above 0, '-' below, '~' if it holds 0 (or is undefined)."""
  if math.isfinite(low) and low > 0:
    return "+"
  if math.isfinite(high) and high < 0:
    return "-"
  return "~"


# --- one run -------------------------------------------------------------------------------------

def series(records: Sequence[Mapping], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of ``key`` in ``records``, ascending steps; a step logged twice keeps its
  last value and null values are dropped."""
  found = {}
  for r in records:
    if r.get(key) is not None:
      found[int(r["step"])] = float(r[key])
  steps = np.asarray(sorted(found), np.int64)
  return steps, np.asarray([found[s] for s in steps], np.float64)


def area_under_curve(steps, values) -> float:
  """Trapezoid area over the steps divided by the step range (module docstring)."""
  steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  if steps.shape != values.shape or steps.ndim != 1:
    raise ValueError(f"area_under_curve: steps {steps.shape} and values {values.shape} must be "
                     "1-D of the same length")
  if np.any(np.diff(steps) <= 0):
    raise ValueError(f"area_under_curve: steps must increase, got {steps.tolist()}")
  if len(steps) == 0:
    return math.nan
  if len(steps) == 1 or steps[-1] == steps[0]:
    return float(values[-1])
  widths = np.diff(steps)
  return float(np.sum(widths * (values[1:] + values[:-1]) / 2) / (steps[-1] - steps[0]))


def final_mean(steps: np.ndarray, values: np.ndarray, window: float = FINAL_WINDOW) -> float:
  """Mean of the last ``ceil(window * len)`` values (at least one); nan when there are none."""
  if len(values) == 0:
    return math.nan
  k = max(1, math.ceil(window * len(values)))
  return float(values[-k:].mean())


def generated_samples(train: Sequence[Mapping], samples_per_round: int | None = None) -> float:
  """The completions a run generated: the sum of its steps' ``generated_samples``; for a run
  logged before that metric existed, ``gen_rounds x samples_per_round`` (every round samples
  ``rollout.prompts_per_step x rollout.group_size``); NaN when neither is known."""
  if train and all("generated_samples" in r for r in train):
    return float(sum(r["generated_samples"] for r in train))
  if train and samples_per_round and all("gen_rounds" in r for r in train):
    return float(sum(r["gen_rounds"] for r in train) * samples_per_round)
  return math.nan


def run_summary(records: Sequence[Mapping], wall_attempts: Sequence[Mapping] = (),
                samples_per_round: int | None = None) -> dict:
  """The summary metrics of one run (``study.SUMMARY_METRICS``, module docstring);
  ``samples_per_round`` as in ``generated_samples``."""
  eval_steps, acc = series(records, "eval_accuracy")
  # Train-step records carry `accuracy`; eval-only records (step 0, the final eval) do not.
  train = [r for r in records if "accuracy" in r]
  out = {
      "final_accuracy": float(acc[-1]) if len(acc) else math.nan,
      "gain_accuracy": float(acc[-1] - acc[0]) if len(acc) else math.nan,
      "best_accuracy": float(acc.max()) if len(acc) else math.nan,
      "auc_accuracy": area_under_curve(eval_steps, acc),
      "mean_truncation_rate": float(np.mean(series(train, "truncation_rate")[1]))
      if train else math.nan,
      "wall_time_s": float(sum(a["wall_s"] for a in wall_attempts)) if wall_attempts else math.nan,
      "generated_samples": generated_samples(train, samples_per_round),
  }
  out["gain_per_1k_samples"] = 100 * out["gain_accuracy"] / out["generated_samples"] * 1000
  for name, key in _FINAL_KEYS.items():
    out[name] = final_mean(*series(train, key))
  return out


# --- a study -------------------------------------------------------------------------------------

def load_runs(specs) -> dict[tuple[str, int], list[dict]]:
  """metrics.jsonl records of every finished run of ``specs`` (``runner.RunSpec``)."""
  return {(s.variant, s.seed): read_jsonl(os.path.join(s.run_dir, "metrics.jsonl"))
          for s in specs if runner.run_state(s) == "finished"}


def summarize_study(study: study_lib.Study, summaries: Mapping[tuple[str, int], dict]) -> list[dict]:
  """One row per (variant, metric): mean and interval over seeds, and the paired difference to
  the baseline. ``summaries`` maps (variant, seed) to ``run_summary`` output."""
  rows = []
  for variant in study.variants:
    for metric in study_lib.SUMMARY_METRICS:
      by_seed = {seed: summaries[(variant.name, seed)][metric] for seed in study.seeds
                 if (variant.name, seed) in summaries}
      base = {seed: summaries[(study.baseline, seed)][metric] for seed in study.seeds
              if (study.baseline, seed) in summaries}
      n, mean, low, high = mean_ci(by_seed.values())
      row = {"variant": variant.name, "metric": metric, "n": n, "mean": mean, "ci_low": low,
             "ci_high": high}
      if variant.name != study.baseline:
        dn, dmean, dlow, dhigh = paired_difference(by_seed, base)
        row.update(diff_n=dn, diff_mean=dmean, diff_low=dlow, diff_high=dhigh,
                   diff_sign=direction(dlow, dhigh))
      else:
        row.update(diff_n=0, diff_mean=math.nan, diff_low=math.nan, diff_high=math.nan,
                   diff_sign="")
      rows.append(row)
  return rows


def write_csv(path: str, rows: Sequence[Mapping]) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
    writer.writeheader()
    writer.writerows(rows)


def fmt(metric: str, value: float) -> str:
  """Accuracies and rates in percent, lengths with one decimal, the rest with 3 digits."""
  if value is None or not math.isfinite(value):
    return "n/a"
  if metric == "generated_samples":  # before the rates: its name holds "rate"
    return f"{value:.0f}"
  if "accuracy" in metric or "rate" in metric:
    return f"{100 * value:.1f}%"
  if "len" in metric:
    return f"{value:.1f}"
  if metric == "wall_time_s":
    return f"{value:.0f} s"
  return f"{value:.3g}"


def _interval(metric: str, mean: float, low: float, high: float, signed: bool = False) -> str:
  text = fmt(metric, mean)
  if signed and math.isfinite(mean) and mean >= 0:
    text = "+" + text
  if math.isfinite(low):
    text += f" [{fmt(metric, low)}, {fmt(metric, high)}]"
  return text


def markdown_table(study: study_lib.Study, rows: Sequence[Mapping]) -> str:
  """Two tables: mean [95% CI] per variant, then the paired difference to the baseline."""
  cell = {(r["variant"], r["metric"]): r for r in rows}
  head = "| variant | seeds | " + " | ".join(study.metrics) + " |\n"
  rule = "|---|---|" + "---|" * len(study.metrics) + "\n"
  means = diffs = ""
  for v in study.variants:
    n = max(cell[(v.name, m)]["n"] for m in study.metrics)
    means += f"| {v.name} | {n} | " + " | ".join(
        _interval(m, cell[(v.name, m)]["mean"], cell[(v.name, m)]["ci_low"],
                  cell[(v.name, m)]["ci_high"]) for m in study.metrics) + " |\n"
    if v.name == study.baseline:
      continue
    pairs = max(cell[(v.name, m)]["diff_n"] for m in study.metrics)
    diffs += f"| {v.name} | {pairs} | " + " | ".join(
        _interval(m, cell[(v.name, m)]["diff_mean"], cell[(v.name, m)]["diff_low"],
                  cell[(v.name, m)]["diff_high"], signed=True) + f" {cell[(v.name, m)]['diff_sign']}"
        for m in study.metrics) + " |\n"
  return (f"Mean over seeds [95% t-interval]:\n\n{head}{rule}{means}\n"
          f"Difference to `{study.baseline}`, paired by seed [95% t-interval] "
          f"(+/-: the interval excludes 0; ~: inconclusive):\n\n"
          f"{head.replace('| seeds |', '| pairs |')}{rule}{diffs}")

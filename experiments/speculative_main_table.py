"""The table of experiments/main_job_speculative.py: per seed and arm, held-out accuracy before and
after, the RL phase's rollout time and tokens/s, the acceptance figures and the sampler-trainer
log-prob gap; then the paired difference (ngram - plain) of the final accuracy and each arm's
mean gain, with 95% t-intervals.

  python experiments/speculative_main_table.py ROOT [--out docs/results/speculative_main]

ROOT: the sweep's --root. Seeds with both arms finished are paired; others are listed only.
``--plain-archive RUNS_CSV``: a plain seed that did not run here takes its final and before
accuracy from an archived sweep of the same job (docs/results/main_job/main_job_seeds/runs.csv,
the study experiments/main_job_seeds.py), where a seed that ran in both agrees to every digit
(checked here: the script stops otherwise); its timing columns stay empty.
"""
import argparse
import csv
import json
import math
import os

import numpy as np
from scipy import stats

STUDY = "main_job_speculative"
ARMS = ("plain", "ngram")


def run_row(path: str) -> dict | None:
  """One run's figures from its metrics.jsonl (None: not finished)."""
  rows = [json.loads(line) for line in open(os.path.join(path, "metrics.jsonl"))]
  evals = [r for r in rows if "eval_accuracy" in r]
  steps = [r for r in rows if "sec_rollout" in r]
  if not evals or evals[-1]["step"] != 200 or evals[0]["step"] != 0:
    return None
  sum_ = lambda k: float(sum(r[k] for r in steps))
  mean = lambda k: float(np.mean([r[k] for r in steps if k in r])) if any(
      k in r for r in steps) else float("nan")
  return {
      "eval_before": evals[0]["eval_accuracy"], "eval_after": evals[-1]["eval_accuracy"],
      "gain": evals[-1]["eval_accuracy"] - evals[0]["eval_accuracy"],
      "rollout_s": sum_("sec_rollout"), "update_s": sum_("sec_update"), "step_s": sum_("sec_step"),
      "generated_tokens": sum_("generated_tokens"),
      "rollout_tokens_per_s": sum_("generated_tokens") / sum_("sec_rollout"),
      "gen_rounds_mean": mean("gen_rounds"),
      "draft_accept_rate": mean("rollout/draft_accept_rate"),
      "tokens_per_verify": mean("rollout/tokens_per_verify"),
      "logp_gap_mean": mean("mismatch/abs_diff_mean"),
  }


def interval(x) -> tuple[float, float, float]:
  """Mean and its 95% t-interval (NaN bounds for one value)."""
  x = np.asarray(x, float)
  m = float(x.mean())
  if len(x) < 2:
    return m, float("nan"), float("nan")
  h = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
  return m, m - h, m + h


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("root")
  ap.add_argument("--out", default="docs/results/speculative_main")
  ap.add_argument("--plain-archive", default=None)
  args = ap.parse_args()
  base = os.path.join(args.root, STUDY)
  table = {}
  for arm in ARMS:
    for name in sorted(os.listdir(os.path.join(base, arm))):
      seed = int(name[len("seed"):])
      row = run_row(os.path.join(base, arm, name))
      if row is not None:
        table[(arm, seed)] = row
  fields = ["arm", "seed", "source"] + list(next(iter(table.values())))
  for row in table.values():
    row["source"] = "this sweep"
  if args.plain_archive:
    archived = {int(r["seed"]): r for r in csv.DictReader(open(args.plain_archive))}
    for seed, r in archived.items():
      final, gain = float(r["final_accuracy"]), float(r["gain_accuracy"])
      if ("plain", seed) in table:  # ran in both: the archive must be this run, digit for digit
        here = table[("plain", seed)]
        if (here["eval_after"], here["gain"]) != (final, gain):
          raise SystemExit(f"plain seed {seed}: this sweep's {here['eval_after']!r} differs from "
                           f"the archive's {final!r}: the archive does not stand in")
        print(f"plain seed {seed}: this sweep's final accuracy {final!r} equals the archive's")
      elif ("ngram", seed) in table:
        nan = float("nan")
        table[("plain", seed)] = dict(
            {k: nan for k in fields[3:]}, eval_before=final - gain, eval_after=final, gain=gain,
            source="archived (" + os.path.basename(os.path.dirname(args.plain_archive)) + ")")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "runs.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fields)
    w.writeheader()
    for (arm, seed), row in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][0])):
      w.writerow({"arm": arm, "seed": seed,
                  **{k: v if isinstance(v, str) else round(v, 6) for k, v in row.items()}})
  seeds = sorted({s for a, s in table if all((arm, s) in table for arm in ARMS)})
  pct = lambda v: f"{100 * v:.1f}%"
  lines = ["| seed | arm | run | held-out before | after 200 steps | gain | rollout s (RL) | "
           "rollout tokens/s | accept rate | tokens / verify | sampler-trainer log-prob gap |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  num = lambda v, f: "" if math.isnan(v) else format(v, f)
  for (arm, seed), r in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][0] != "plain")):
    acc = "" if math.isnan(r["draft_accept_rate"]) else pct(r["draft_accept_rate"])
    tpv = "" if math.isnan(r["tokens_per_verify"]) else f"{r['tokens_per_verify']:.3f}"
    lines.append(f"| {seed} | {arm} | {r['source']} | {pct(r['eval_before'])} | "
                 f"{pct(r['eval_after'])} | {100 * r['gain']:+.1f} | {num(r['rollout_s'], '.0f')} | "
                 f"{num(r['rollout_tokens_per_s'], '.0f')} | {acc} | {tpv} | "
                 f"{num(r['logp_gap_mean'], '.2e')} |")
  summary = []
  if seeds:
    diff = [table[("ngram", s)]["eval_after"] - table[("plain", s)]["eval_after"] for s in seeds]
    m, lo, hi = interval(np.asarray(diff) * 100)
    summary.append(f"- paired difference of the final accuracy, ngram - plain, seeds "
                   f"{seeds}: {m:+.2f} points [{lo:+.2f}, {hi:+.2f}] (95% t-interval)")
    for arm in ARMS:
      m, lo, hi = interval([100 * table[(arm, s)]["gain"] for s in seeds])
      fa, flo, fhi = interval([100 * table[(arm, s)]["eval_after"] for s in seeds])
      summary.append(f"- {arm}: mean gain {m:+.2f} points [{lo:+.2f}, {hi:+.2f}], final "
                     f"accuracy {fa:.2f}% [{flo:.2f}, {fhi:.2f}]")
    timed = [s for s in seeds if table[("plain", s)]["source"] == "this sweep"]
    ratio = [table[("ngram", s)]["rollout_s"] / table[("plain", s)]["rollout_s"] for s in timed]
    tps = [table[("ngram", s)]["rollout_tokens_per_s"] / table[("plain", s)]["rollout_tokens_per_s"]
           for s in timed]
    summary.append(f"- rollout time ngram / plain, seeds {timed} (each pair ran at once): "
                   f"{', '.join(f'{x:.2f}x' for x in ratio)}; rollout tokens/s ratio "
                   f"{', '.join(f'{x:.2f}x' for x in tps)}")
  with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write("\n".join(lines + [""] + summary) + "\n")
  print("\n".join(lines + [""] + summary))


if __name__ == "__main__":
  main()

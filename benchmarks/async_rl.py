"""Asynchronous RL (issue 24, docs/async.md): the sampler on one CPU device, the learner on the
other, synchronous against ``rollout.max_staleness`` 1 and 2.

``main``: the study ``experiments/async_main.py`` (the main job, 3 seeds), run by ``rljax sweep``;
this reads its runs and reports, per seed, the training wall time each variant needs to reach the
synchronous run's final held-out accuracy (the sum of ``sec_step`` up to the first eval at or
above it: the evals themselves, the same in every variant, are left out), the speed-up over
``sync`` as a mean with a 95% t-interval over seeds, and the final accuracies::

  XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
    python -m rljax sweep experiments/async_main.py --root runs/async
  python benchmarks/async_rl.py main --root runs/async

``throughput``: steps of the main job (DAPO with dynamic sampling: a step samples 1 to
``algo.max_gen_batches`` rounds, so its rollout time is long-tailed) from an existing SFT cold
start, each variant in its own process on 2 CPU devices; steady-state steps/s and generated
tokens/s (the first ``--warmup`` steps, compilation included, left out)::

  python benchmarks/async_rl.py throughput --sft runs/async/_sft/<hash> --steps 60
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("sync", "async1", "async2")
SPLIT = ["--config.mesh.sampler_devices=1"]
THROUGHPUT = {"sync": SPLIT, "async1": SPLIT + ["--config.rollout.max_staleness=1"],
              "async2": SPLIT + ["--config.rollout.max_staleness=2"]}
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # t quantile 0.975 by dof


def read_rows(run_dir: str) -> list[dict]:
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def eval_curve(rows: list[dict]) -> list[tuple[int, float, float]]:
  """``(step, eval accuracy, training seconds so far)`` for every eval, the one before training
  (0 s) included; training seconds = the sum of ``sec_step`` of the steps up to it."""
  elapsed, by_step, curve = 0.0, {}, []
  for r in rows:
    if "sec_step" in r:
      elapsed += r["sec_step"]
      by_step[r["step"]] = elapsed
  for r in rows:
    if "eval_accuracy" in r:
      curve.append((r["step"], r["eval_accuracy"], by_step.get(r["step"], 0.0)))
  return curve


def time_to(curve, target: float) -> float:
  """Training seconds to the first eval at or above ``target`` (nan: never reached)."""
  return next((t for _, acc, t in curve if acc >= target - 1e-9), math.nan)


def mean_ci(xs: list[float]) -> str:
  xs = [x for x in xs if not math.isnan(x)]
  if not xs:
    return "n/a"
  m = statistics.fmean(xs)
  if len(xs) < 2:
    return f"{m:.2f} (1 seed)"
  h = T95[len(xs) - 1] * statistics.stdev(xs) / math.sqrt(len(xs))
  return f"{m:.2f} [{m - h:.2f}, {m + h:.2f}]"


def report_main(root: str) -> str:
  study = os.path.join(root, "async_main")
  seeds = sorted({d for v in VARIANTS if os.path.isdir(os.path.join(study, v))
                  for d in os.listdir(os.path.join(study, v)) if d.startswith("seed")})
  lines = ["| seed | variant | final acc | sync's final acc reached at step | training s to it | "
           "speed-up vs sync | mean s/step | mean staleness |", "|---|---|---|---|---|---|---|---|"]
  speedups = {v: [] for v in VARIANTS}
  finals = {v: [] for v in VARIANTS}
  rates = {v: [] for v in VARIANTS}  # steady-state generated tokens/s relative to sync's
  for seed in seeds:
    curves, rows_by = {}, {}
    for v in VARIANTS:
      path = os.path.join(study, v, seed)
      if os.path.isfile(os.path.join(path, "metrics.jsonl")):
        rows_by[v] = read_rows(path)
        curves[v] = eval_curve(rows_by[v])
    if "sync" not in curves or curves["sync"][-1][0] == 0:
      continue
    target = curves["sync"][-1][1]
    base = time_to(curves["sync"], target)
    tokens_per_s = {v: _tokens_per_s(rows) for v, rows in rows_by.items()}
    for v, rate in tokens_per_s.items():
      rates[v].append(rate / tokens_per_s["sync"])
    for v, curve in curves.items():
      t = time_to(curve, target)
      step = next((s for s, acc, _ in curve if acc >= target - 1e-9), None)
      steps = [r for r in rows_by[v] if "sec_step" in r]
      stale = [r.get("async/staleness", 0.0) for r in steps]
      speedup = base / t if t and not math.isnan(t) else math.nan
      if v != "sync":
        speedups[v].append(speedup)
      finals[v].append(curve[-1][1])
      lines.append(f"| {seed} | {v} | {curve[-1][1]:.3f} | {step if step is not None else '-'} | "
                   f"{t:.0f} | {speedup:.2f} | "
                   f"{statistics.fmean(r['sec_step'] for r in steps):.3f} | "
                   f"{statistics.fmean(stale):.2f} |")
  lines += ["", "| variant | final accuracy, mean [95% t-interval] | generated tokens/s vs "
            "sync (steps 6+), mean [95% t-interval] | speed-up to sync's final "
            "accuracy, mean [95% t-interval] (seeds that reached it) |", "|---|---|---|---|"]
  for v in VARIANTS:
    lines.append(f"| {v} | {mean_ci(finals[v])} | {mean_ci(rates[v])} | "
                 f"{'1 (the reference)' if v == 'sync' else mean_ci(speedups[v])} "
                 f"{'' if v == 'sync' else f'({sum(not math.isnan(x) for x in speedups[v])}/{len(speedups[v])} reached)'} |")
  return "\n".join(lines)


def _tokens_per_s(rows: list[dict], warmup: int = 5) -> float:
  steps = [r for r in rows if "sec_step" in r][warmup:]
  return sum(r["generated_tokens"] for r in steps) / sum(r["sec_step"] for r in steps)


def run_throughput(args) -> str:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  results = {}
  for name, extra in THROUGHPUT.items():
    run_dir = os.path.join(args.out, name)
    cmd = [sys.executable, "-m", "rljax", "train", "--config", "configs/jobs/main_600.py",
           f"--config.sft.out_dir={os.path.abspath(args.sft)}", f"--config.train.steps={args.steps}",
           "--config.train.eval_every=0", "--config.data.num_eval=16", "--config.train.progress=false",
           "--config.train.export_hf=false", "--config.train.compilation_cache=false",
           f"--config.train.run_dir={run_dir}", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
      raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    steps = [r for r in read_rows(run_dir) if "sec_step" in r][args.warmup:]
    wall = sum(r["sec_step"] for r in steps)
    rollout = sorted(r["sec_rollout"] for r in steps)
    results[name] = dict(
        steps_per_s=len(steps) / wall,
        tokens_per_s=sum(r["generated_tokens"] for r in steps) / wall,
        rollout_p50=rollout[len(rollout) // 2], rollout_p90=rollout[int(len(rollout) * 0.9)],
        rollout_max=rollout[-1], update=statistics.fmean(
            r["sec_update"] for r in steps),
        rounds=statistics.fmean(r["gen_rounds"] for r in steps),
        staleness=statistics.fmean(r.get("async/staleness", 0.0) for r in steps),
        sync_bytes=steps[-1].get("weights/sync_bytes", 0.0),
        sync_sec=statistics.fmean(r.get("weights/sync_sec", 0.0) for r in steps))
  base = results["sync"]["steps_per_s"]
  lines = ["| variant | steps/s | speed-up | generated tokens/s | rollout s p50 / p90 / max | "
           "gen rounds per step | mean staleness | weights per transfer |",
           "|---|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    lines.append(f"| {name} | {r['steps_per_s']:.3f} | {r['steps_per_s'] / base:.2f}x | "
                 f"{r['tokens_per_s']:.0f} | {r['rollout_p50']:.3f} / {r['rollout_p90']:.3f} / "
                 f"{r['rollout_max']:.3f} | {r['rounds']:.2f} | {r['staleness']:.2f} | "
                 f"{r['sync_bytes'] / 1e6:.2f} MB in {r['sync_sec'] * 1e3:.2f} ms |")
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  m = sub.add_parser("main")
  m.add_argument("--root", default="runs/async")
  t = sub.add_parser("throughput")
  t.add_argument("--sft", required=True,
                 help="an SFT cold start directory of configs/jobs/main_600.py")
  t.add_argument("--steps", type=int, default=60)
  t.add_argument("--warmup", type=int, default=5)
  t.add_argument("--out", default="runs/async_throughput")
  args = ap.parse_args(argv)
  print(report_main(args.root) if args.cmd == "main" else run_throughput(args))


if __name__ == "__main__":
  main()

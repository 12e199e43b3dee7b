"""DAPO vs GRPO vs Dr. GRPO on the main job, from the same SFT cold start, one after another.

  python experiments/compare_main.py [--only dapo,grpo] [--reuse]

Runs ``python -m rljax train --config configs/main{,_grpo,_dr_grpo}.py`` sequentially (the
machine has 2 cores: never two at once), times each, then writes the overlaid curves to
docs/main_job_curves.png and a table (eval before/after, wall time) to docs/main_job_results.md.
The first run trains the SFT cold start if runs/sft has none; the others reuse it. ``--reuse``
skips a run whose wall time was recorded (by an earlier invocation or ``--record``) and whose
metrics file ends with the final eval, e.g. after the README command was timed separately:

  /usr/bin/time -v python -m rljax train --config configs/main.py
  python experiments/compare_main.py --reuse --record dapo=SECONDS:sft
"""
import argparse
import json
import os
import subprocess
import sys
import time

from rljax.config_loader import load_config
from rljax.train import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = {"dapo": "configs/main.py", "grpo": "configs/main_grpo.py",
        "dr_grpo": "configs/main_dr_grpo.py"}
TIMES = os.path.join(ROOT, "runs", "compare_main_times.json")
PNG = os.path.join(ROOT, "docs", "main_job_curves.png")
TABLE = os.path.join(ROOT, "docs", "main_job_results.md")


def evals(metrics_path: str) -> list[tuple[int, float]]:
  """(step, eval_accuracy) in file order; a re-logged step keeps its last value."""
  found = {}
  with open(metrics_path) as f:
    for line in f:
      record = json.loads(line)
      if record.get("eval_accuracy") is not None:
        found[record["step"]] = record["eval_accuracy"]
  return sorted(found.items())


def run_one(name: str, config_path: str) -> dict:
  cmd = [sys.executable, "-m", "rljax", "train", "--config", config_path,
         "--config.train.progress=false"]
  print(f"== {name}: {' '.join(cmd)}", flush=True)
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True)
  wall = time.perf_counter() - t0
  log_path = os.path.join(ROOT, "runs", f"compare_main_{name}.log")
  with open(log_path, "w") as f:
    f.write(proc.stdout)
  if proc.returncode:
    print(proc.stdout[-4000:])
    raise SystemExit(f"{name} failed (exit {proc.returncode}); log in {log_path}")
  return {"wall_s": wall, "trained_sft": "training the SFT cold start" in proc.stdout}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", default=",".join(RUNS), help="comma-separated subset to run")
  parser.add_argument("--reuse", action="store_true",
                      help="keep finished runs whose wall time is already recorded")
  parser.add_argument("--record", action="append", default=[], metavar="NAME=SECONDS[:sft]",
                      help="record the wall time of a run timed outside this script (e.g. the "
                      "README command under /usr/bin/time); ':sft' when it trained the SFT start")
  args = parser.parse_args()
  times = {}
  if os.path.isfile(TIMES):
    with open(TIMES) as f:
      times = json.load(f)
  for item in args.record:
    name, value = item.split("=", 1)
    seconds, _, sft_flag = value.partition(":")
    times[name] = {"wall_s": float(seconds), "trained_sft": sft_flag == "sft"}
  configs = {name: load_config(os.path.join(ROOT, path)) for name, path in RUNS.items()}
  for name in args.only.split(","):
    cfg = configs[name]
    metrics = os.path.join(ROOT, cfg.train.run_dir, "metrics.jsonl")
    done = (os.path.isfile(metrics) and evals(metrics)
            and evals(metrics)[-1][0] == cfg.train.steps)
    if args.reuse and done and name in times:
      print(f"== {name}: reusing {cfg.train.run_dir} ({times[name]['wall_s']:.0f}s)")
      continue
    times[name] = run_one(name, RUNS[name])
    os.makedirs(os.path.dirname(TIMES), exist_ok=True)
    with open(TIMES, "w") as f:
      json.dump(times, f, indent=2)

  rows, curves = [], {}
  for name, path in RUNS.items():
    cfg = configs[name]
    metrics = os.path.join(ROOT, cfg.train.run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics) or name not in times:
      continue
    curves[name] = metrics
    ev = evals(metrics)
    before, after = ev[0][1], ev[-1][1]
    mid = ", ".join(f"{s}: {a:.1%}" for s, a in ev[1:-1])
    t = times[name]
    rows.append(f"| {name} | `{path}` | {before:.1%} | {after:.1%} | {after - before:+.1%} | "
                f"{mid or '-'} | {t['wall_s']:.0f} s{' (incl. SFT)' if t['trained_sft'] else ''} |")
  plot.plot_compare(curves, PNG, title="main job: DAPO vs GRPO vs Dr. GRPO (same SFT start)")
  main_cfg = configs["dapo"]
  with open(TABLE, "w") as f:
    f.write("# Main job: DAPO vs GRPO vs Dr. GRPO\n\n")
    f.write(f"Embedded arithmetic difficulty {main_cfg.data.difficulty}, greedy pass@1 on "
            f"{main_cfg.data.num_eval} held-out problems, from the same SFT cold start "
            f"({main_cfg.sft.steps} steps, `{main_cfg.sft.out_dir}`); "
            f"{main_cfg.train.steps} RL steps of {main_cfg.rollout.prompts_per_step} prompts x "
            f"{main_cfg.rollout.group_size} completions, lr {main_cfg.optim.lr:g}, "
            f"{main_cfg.algo.minibatches} minibatch(es). Wall time of "
            "`python -m rljax train --config <config>` on the 2-core CPU machine, compilation "
            "included; \"incl. SFT\" when that run trained the cold start first.\n\n")
    f.write("| algorithm | config | eval before | eval after | change | intermediate evals "
            "| wall time |\n|---|---|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n\n")
    f.write("Curves: [main_job_curves.png](main_job_curves.png) (written by "
            "`python experiments/compare_main.py`).\n")
  print(open(TABLE).read())


if __name__ == "__main__":
  main()

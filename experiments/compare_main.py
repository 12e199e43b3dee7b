"""DAPO vs GRPO vs Dr. GRPO on the main job, from the same SFT cold start, one after another.

  python experiments/compare_main.py [--only dapo,grpo] [--reuse]

Runs ``python -m rljax train --config configs/main{,_grpo,_dr_grpo}.py`` sequentially (the
machine has 2 cores: never two at once), times each, then writes the overlaid curves to
docs/results/main_600_algorithms/curves.png and a table (eval before/after, wall time) to docs/results/main_600_algorithms/README.md.
The first run trains the SFT cold start if runs/sft_600 has none; the others reuse it. ``--reuse``
skips a run whose wall time was recorded (by an earlier invocation or ``--record``) and whose
metrics file ends with the final eval, e.g. after the README command was timed separately:

  /usr/bin/time -v python -m rljax train --config configs/jobs/main_600.py
  python experiments/compare_main.py --reuse --record dapo=SECONDS:sft
"""
import argparse
import json
import os
import subprocess
import sys
import time

from rljax.config.loader import load_config
from rljax.runs import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = {"dapo": "configs/jobs/main_600.py", "grpo": "configs/jobs/main_600_grpo.py",
        "dr_grpo": "configs/jobs/main_600_dr_grpo.py"}
TIMES = os.path.join(ROOT, "runs", "compare_main_times.json")
PNG = os.path.join(ROOT, "docs", "results", "main_600_algorithms", "curves.png")
TABLE = os.path.join(ROOT, "docs", "results", "main_600_algorithms", "README.md")
# How configs/jobs/main_600.py was chosen (experiments/tune_main.sh, one run at a time on the 2-core
# CPU machine); kept here so that refreshing the results table keeps it.
TUNING = """\
## Tuning (experiments/tune_main.sh)

The timed run: `rm -rf runs/main_600 runs/sft_600 && /usr/bin/time -v python -m rljax train --config
configs/jobs/main_600.py` -> 5:45 wall clock (SFT 250 steps, compilation, 600 DAPO steps, 13 evals),
eval 40.6% -> 66.0%, peak RSS 1.0 GB; recorded with `--record dapo=345:sft`.

Arithmetic level 0 (three single-digit operands, `+-*`, no parentheses; the same problems as
level 1 before the level recalibration in 60f1f12). Start = the SFT cold start, measured with
`python -m rljax eval --config configs/jobs/main_600.py --samples 8` (greedy pass@1, pass@8 and
maj@8 at T=1). All DAPO (dynamic sampling, clip 0.2/0.28, token-mean, overlong buffer 3 of 24
tokens, no KL), 16 prompts per step, max_grad_norm 1.0, warmup 5-10.

| SFT steps | start pass@1 / pass@8 / maj@8 | RL settings | eval curve (step: greedy pass@1) | change |
|---|---|---|---|---|
| 150 | 21.5% / 49.2% / 22.3% | lr 5e-5 x 4 minibatches, G=8, 150 steps | 0: 21.5, 50: 17.2, 100: 21.1, 150: 20.7 | -0.8 |
| 150 | same | lr 1.5e-4 x 4, G=8, 250 steps | 0: 21.5, 100: 18.4, 250: 20.3 | -1.2 |
| 200 | 29.3% | lr 1e-4 x 4, G=16, 200 steps | 0: 29.3, 50: 23.0, 100: 26.2, 200: 30.5 | +1.2 |
| 200 | 29.3% | lr 1e-4 x 4, G=16, T=0.6, 200 steps | 0: 29.3, 50: 27.7, 150: 30.1, 200: 31.6 | +2.3 |
| 200 | 29.3% | lr 2e-4 x 4, G=16, pos_lm_coef 1.0 (stopped at 132) | 0: 29.3, 50: 24.6, 100: 22.7 (entropy 0.33 -> 0.11) | -6.6 |
| 250 | 40.6% / 70.7% / 42.2% | lr 3e-5 x 4, G=8, 400 steps (210 s without SFT) | 0: 40.6, 100: 46.9, 200: 54.3, 300: 56.6, 400: 60.5 | +19.9 |
| 250 | 40.6% / 70.7% / 42.2% | configs/jobs/main_600.py: the same, 600 steps | 0: 40.6, 200: 54.3, 400: 60.5, 500: 61.7, 600: 66.0 | +25.4 |
| 300 | 58.6% / 75.0% / 53.1% | (start above the 10-60% window with room for +20) | - | - |

Rejected: countdown level 0 after 200 SFT steps is 3.9% greedy, pass@8 3.5%. Before the level
recalibration (same problems): lr 3e-4 x 4 collapsed (43% -> 19% in 60 steps), 1e-4 x 2 stayed
flat, 3e-5 x 4 rose (43% -> 48% in 60 steps). At the start maj@8 is about greedy pass@1, so
sharpening alone has little to convert: RL has to teach arithmetic facts (the errors are steps
like `4+1=10`, the format is already 99% right), which only the small step does without first
undoing the SFT; what it lacks in speed the 600 steps make up for within the 10-minute budget.
"""


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


def machine_date_commit() -> str:
  """This machine's CPU model (``/proc/cpuinfo``), today's date and the checkout's commit."""
  model = "unknown CPU"
  if os.path.isfile("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    if names:
      model = f"{len(names)}-core {names[0]}"
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "unknown commit"
  return f"{model}, {time.strftime('%Y-%m-%d')}, commit {commit}"


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
  if args.record:  # kept for later --reuse invocations even when nothing runs now
    os.makedirs(os.path.dirname(TIMES), exist_ok=True)
    with open(TIMES, "w") as f:
      json.dump(times, f, indent=2)
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
    f.write("# The former 600-step main job: DAPO vs GRPO vs Dr. GRPO\n\n")
    f.write(f"**Current result** ({machine_date_commit()}, `python experiments/compare_main.py`): "
            + ", ".join(f"{r.split(' | ')[0][2:]} {r.split(' | ')[3]}" for r in rows)
            + " of held-out greedy accuracy after the RL steps; the table and "
            "[curves.png](curves.png) below.\n\n")
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
    f.write("Curves: [curves.png](curves.png) (written by "
            "`python experiments/compare_main.py`).\n\n")
    f.write(TUNING)
  print(open(TABLE).read())


if __name__ == "__main__":
  main()

"""On-policy distillation demo (issue 13, ALGORITHMS.md 8.6): a small student trained by the main
job's recipe alone vs. the same student with the main job's policy as a distillation teacher.

  python experiments/opd_demo.py            # runs what is missing under runs/opd_demo, then
                                            # prints the comparison at equal wall clock

1. Teacher: the main job (``configs/jobs/main_600.py``: SFT cold start, then DAPO), its policy
exported to
   ``runs/opd_demo/teacher/hf``.
2. Student: a model of a quarter of the teacher's width x half its depth, its own SFT cold start.
3. From that cold start, two runs of the main job's recipe: RL alone, and RL + on-policy
   distillation (``algo.opd_coef=1``, ``teacher.source=run:runs/opd_demo/teacher``). The
   distillation run pays a teacher forward per step, so the comparison is at equal wall clock:
   the held-out accuracy of each run's last evaluation that finished within the shorter run's
   total time (cumulated ``sec_step`` plus nothing else: evaluations are not counted).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "runs", "opd_demo")
STUDENT = {"model.hidden_size": 64, "model.intermediate_size": 192, "model.num_layers": 2,
           "model.num_heads": 2, "model.num_kv_heads": 1,
           "sft.out_dir": os.path.join(OUT, "sft_student")}
STEPS = int(os.environ.get("OPD_DEMO_STEPS", "300"))


def train(run_dir, overrides):
  if os.path.exists(os.path.join(run_dir, "hf", "config.json")):
    return  # finished earlier
  args = [sys.executable, "-m", "rljax", "train", "--config",
          os.path.join(ROOT, "configs", "jobs", "main_600.py"), f"--config.train.run_dir={run_dir}",
          "--config.train.progress=false"]
  args += [f"--config.{k}={v}" for k, v in overrides.items()]
  print(" ".join(args), flush=True)
  subprocess.run(args, check=True, cwd=ROOT)


def curve(run_dir):
  """[(cumulated step seconds, eval accuracy)] of a run, from its metrics.jsonl."""
  points, seconds = [], 0.0
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      seconds += record.get("sec_step") or 0.0
      if record.get("eval_accuracy") is not None:
        points.append((seconds, record["eval_accuracy"], record["step"]))
  return points


def main():
  teacher = os.path.join(OUT, "teacher")
  train(teacher, {"sft.out_dir": os.path.join(OUT, "sft_teacher")})
  common = dict(STUDENT, **{"train.steps": STEPS, "train.eval_every": max(25, STEPS // 12)})
  distill = {"algo.opd_coef": 1.0, "teacher.source": f"run:{teacher}"}
  # (name, run dir, overrides): the main job's recipe, then with the teacher's term; at the main
  # job's lr and at a larger one; the last pair also without dynamic sampling for distillation
  # (DAPO drops every group without a reward spread, and with it the teacher's dense signal).
  pairs = [
      ("rl lr 3e-5", "student_rl", {}),
      ("rl+opd lr 3e-5", "student_opd", distill),
      ("rl lr 1e-4", "student_rl_lr1e-4", {"optim.lr": 1e-4}),
      ("rl+opd lr 1e-4, no dyn. sampling", "student_opd_lr1e-4",
       dict(distill, **{"optim.lr": 1e-4, "algo.dynamic_sampling": False})),
      # The main job's recipe unchanged plus a tenth of Tinker's coefficient.
      ("rl lr 1e-4 ", "student_rl_lr1e-4", {"optim.lr": 1e-4}),
      ("rl+opd coef 0.1, lr 1e-4", "student_opd0.1_lr1e-4",
       dict(distill, **{"optim.lr": 1e-4, "algo.opd_coef": 0.1})),
  ]
  # OPD_DEMO_PAIRS=1: only the second pair (e.g. a longer run with OPD_DEMO_STEPS=1200).
  chosen = os.environ.get("OPD_DEMO_PAIRS")
  if chosen is not None:
    pairs = [p for i, p in enumerate(pairs) if str(i // 2) in chosen.split(",")]
  curves = {"teacher": curve(teacher)}
  for name, sub, overrides in pairs:
    run_dir = os.path.join(OUT, f"{sub}_{STEPS}")
    train(run_dir, dict(common, **overrides))
    curves[name] = curve(run_dir)
  print(f"teacher: eval before {curves['teacher'][0][1]:.3f}, after {curves['teacher'][-1][1]:.3f}")
  for first, second in zip(pairs[::2], pairs[1::2]):
    budget = min(curves[first[0]][-1][0], curves[second[0]][-1][0])
    for name in (first[0], second[0]):
      points = curves[name]
      within = [p for p in points if p[0] <= budget + 1e-9]
      print(f"student {name}: eval before {points[0][1]:.3f}; at {budget:.0f} s of steps: "
            f"{within[-1][1]:.3f} (step {within[-1][2]}); end ({points[-1][0]:.0f} s, step "
            f"{points[-1][2]}): {points[-1][1]:.3f}")
      print("  curve (s, acc): " + ", ".join(f"({s:.0f}, {a:.3f})" for s, a, _ in points))


if __name__ == "__main__":
  main()

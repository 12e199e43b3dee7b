"""`configs/tasks/tool_calc.py` (issue 23's multi-turn environment) over five seeds: held-out pass@1
before (the SFT cold start) and after RL as means with 95% intervals. The seeds are RL runs from one
cold start.

  python -m rljax sweep experiments/tool_calc_seeds.py --root runs/multiturn --parallel 2
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="tool_calc_seeds",
      config="configs/tasks/tool_calc.py",
      variants=independent([("rl", {})]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_accuracy", "gain_accuracy", "wall_time_s"),
      baseline="rl",
      description="Does RL in the tool_calc environment raise held-out pass@1 over the cold start?")

"""`configs/tasks/guess.py` (issue 23's multi-turn environment) over three seeds: held-out pass@1
before (the SFT cold start) and after RL as means with 95% intervals. The seeds are RL runs from one
cold start.

  python -m rljax sweep experiments/guess_seeds.py --root runs/multiturn --parallel 2
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="guess_seeds",
      config="configs/tasks/guess.py",
      variants=independent([("rl", {})]),
      seeds=(0, 1, 2),
      metrics=("final_accuracy", "gain_accuracy", "wall_time_s"),
      baseline="rl",
      description="Does RL in the guess environment raise held-out pass@1 over the cold start?")

"""`configs/tasks/reasoning_gym.py` (reasoning-gym's chain_sum, scored by its own `score_answer`)
over five seeds: held-out greedy accuracy before (the SFT cold start) and after RL, as means with
95% intervals. The seeds are RL runs from one cold start.

  pip install 'rljax[reasoning_gym]'
  python -m rljax sweep experiments/reasoning_gym_seeds.py --root runs/reasoning_gym --parallel 2
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="reasoning_gym_seeds",
      config="configs/tasks/reasoning_gym.py",
      variants=independent([("dapo", {})]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "wall_time_s"),
      baseline="dapo",
      description="Does DAPO on reasoning-gym's chain_sum raise held-out accuracy over the cold "
                  "start, on every seed?")

"""An exploratory pilot, not a result: which recipe of `configs/tasks/visual.py` lets five seeds
read GRPO's gain over the SFT cold start? Three seeds (100-102, never used by a confirmation) of
four arms, every arm evaluated on 512 held-out images instead of 128 (the 35 held-out sums drawn
anew more often: a run's gain then moves by 0.2 points per image rather than 0.8):

  python -m rljax sweep experiments/visual_pilot.py --root /tmp/visual --parallel 2

``preset``: the preset's GRPO (100 steps of 8 prompts x 8 samples at 3e-5); ``long``: 300 steps;
``wide``: 32 prompts a step; ``lr1e-4``: a learning rate 3.3x higher. The arm chosen here is then
confirmed on fresh seeds fixed in advance (docs/results/visual/).
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="visual_pilot",
      config="configs/tasks/visual.py",
      variants=independent([("preset", {}),
                            ("long", {"train.steps": 300}),
                            ("wide", {"rollout.prompts_per_step": 32}),
                            ("lr1e-4", {"optim.lr": 1e-4})]),
      seeds=(100, 101, 102),
      metrics=("final_accuracy", "gain_accuracy", "best_accuracy", "wall_time_s"),
      baseline="preset",
      overrides={"data.num_eval": 512},
      description="Pilot: which GRPO recipe raises the visual task's held-out accuracy most "
                  "clearly over its cold start (three seeds, exploratory)?")

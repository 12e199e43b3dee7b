"""Group size at a fixed sampling budget: 64 completions per step as 16 prompts x 4, 8 x 8 or
4 x 16 (GRPO). More completions per prompt give a better group baseline and more groups with a
reward spread; more prompts give more distinct questions per update. Which wins here?

  python -m rljax sweep experiments/studies/group_size.py

The update schedule (4 minibatches of 16 rows) is the same in every arm; minibatches hold whole
rows, so each sees the same number of completions.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="group_size",
      config="configs/studies/arith_l1_grpo.py",
      variants=independent([
          ("G4_P16", {"rollout.group_size": 4, "rollout.prompts_per_step": 16}),
          ("G8_P8", {"rollout.group_size": 8, "rollout.prompts_per_step": 8}),
          ("G16_P4", {"rollout.group_size": 16, "rollout.prompts_per_step": 4}),
      ]),
      seeds=(0, 1, 2),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "best_accuracy", "final_entropy",
               "wall_time_s"),
      baseline="G8_P8",
      description="Group size at 64 completions per step: accuracy against G = 8.")

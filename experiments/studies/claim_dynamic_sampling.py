"""Claim (DAPO, arXiv 2503.14476, section 3.2): dynamic sampling (drop the groups whose rewards
are all equal, which give GRPO no gradient, and sample more until the batch is full) reaches an
accuracy in fewer steps, though each step generates more.

  python -m rljax sweep experiments/studies/claim_dynamic_sampling.py --root runs/studies

On the study scale (configs/studies/main_150.py: the main job's first 150 RL steps), five seeds: the
main job against the same without dynamic sampling. Compared at equal steps (``gain_accuracy``)
and per completion generated (``gain_per_1k_samples``: points per 1,000 completions, every
sampling round counted). Verdict: docs/results/claims/README.md.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="claim_dynamic_sampling",
      config="configs/studies/main_150.py",
      variants=independent([
          ("dynamic", {}),
          ("no_dynamic", {"algo.dynamic_sampling": False}),
      ]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("gain_accuracy", "final_accuracy", "auc_accuracy", "generated_samples",
               "gain_per_1k_samples", "wall_time_s"),
      baseline="dynamic",
      description="Dynamic sampling: more accuracy per step, and per generated completion?")

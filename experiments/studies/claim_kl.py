"""Claim (DAPO, arXiv 2503.14476, section 2.3; Open-Reasoner-Zero): for reasoning RL from a
cold start the KL penalty to the initial policy is unnecessary: the policy should move far from
it, and dropping the term costs no accuracy.

  python -m rljax sweep experiments/studies/claim_kl.py --root runs/studies

On the study scale (configs/studies/main_150.py: the main job's first 150 RL steps, no KL term),
five seeds: the main job against the same with GRPO's k3 estimator in the loss at coefficient 1e-3
to the frozen cold start. Verdict (accuracy and entropy): docs/results/claims/README.md.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="claim_kl",
      config="configs/studies/main_150.py",
      variants=independent([
          ("no_kl", {}),
          ("k3_1e-3", {"algo.kl_placement": "loss", "algo.kl_estimator": "k3",
                       "algo.kl_coef": 1e-3}),
      ]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "final_entropy",
               "wall_time_s"),
      baseline="no_kl",
      description="KL (k3 in the loss, 1e-3) vs none: does dropping it cost accuracy?")

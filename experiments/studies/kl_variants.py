"""KL regularisation: none (ORZ, DAPO) vs k3 in the loss (GRPO) vs k1 in the reward (PPO/RLHF)
vs k3 in the loss against an EMA reference (T1's "dynamic anchor", arXiv 2501.11651).

  python -m rljax sweep experiments/studies/kl_variants.py

One coefficient (0.04, GRPO's) for all three so that only the placement, the estimator and the
reference differ. The claim of ORZ/DAPO: dropping KL costs nothing and lets the policy move
further; of T1: an EMA reference keeps the regularisation without anchoring to the start.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="kl_variants",
      config="configs/studies/arith_l1_grpo.py",
      variants=independent([
          ("no_kl", {"algo.kl_placement": "none"}),
          ("k3_loss", {"algo.kl_placement": "loss", "algo.kl_estimator": "k3",
                       "algo.kl_coef": 0.04}),
          ("k1_reward", {"algo.kl_placement": "reward", "algo.kl_estimator": "k1",
                         "algo.kl_coef": 0.04}),
          ("k3_loss_ema_ref", {"algo.kl_placement": "loss", "algo.kl_estimator": "k3",
                               "algo.kl_coef": 0.04, "algo.ref_update": "ema",
                               "algo.ref_ema_decay": 0.99}),
      ]),
      seeds=(0, 1, 2),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "final_entropy", "final_len_mean",
               "wall_time_s"),
      baseline="no_kl",
      description="KL variants against no KL: accuracy and entropy over training.")

"""Clip-higher against entropy collapse (DAPO, arXiv 2503.14476, section 3.1): symmetric
clipping (0.2/0.2) lets the policy's entropy collapse; a larger upper bound (0.28) keeps it up
and lets low-probability tokens rise. One larger eps_high (0.4) shows the trend.

  python -m rljax sweep experiments/studies/clip_higher.py

Clipping only acts when the ratio leaves [1 - eps_low, 1 + eps_high], i.e. on updates after the
first of a batch: this study takes two epochs over four minibatches (8 updates per batch) and a
larger step than the base, so that the clip fractions (curves.png) are not zero. No KL (as DAPO),
which would also hold the entropy up.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="clip_higher",
      config="configs/studies/arith_l1_grpo.py",
      overrides={"algo.kl_placement": "none", "algo.epochs": 2, "algo.minibatches": 4,
                 "optim.lr": 1e-4},
      variants=independent([
          ("sym_0.20", {"algo.clip_eps_high": 0.2}),
          ("high_0.28", {"algo.clip_eps_high": 0.28}),
          ("high_0.40", {"algo.clip_eps_high": 0.4}),
      ]),
      seeds=(0, 1, 2),
      metrics=("final_entropy", "final_accuracy", "gain_accuracy", "auc_accuracy", "best_accuracy",
               "wall_time_s"),
      baseline="sym_0.20",
      description="Clip-higher: is the final entropy higher than with symmetric clipping, and "
                  "is accuracy at least as good?")

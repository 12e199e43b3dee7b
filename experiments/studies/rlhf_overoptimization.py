"""Reward over-optimisation in the embedded RLHF demo (configs/tasks/rlhf.py,
docs/reward_models.md): GRPO against a learned reward model (the proxy) with the hidden gold score
logged, over KL penalties and seeds (Gao, Schulman, Hilton 2022, arXiv 2210.10760).

  python -m rljax sweep experiments/studies/rlhf_overoptimization.py
  python experiments/rlhf_overoptimization_plot.py runs/studies/rlhf_overoptimization

The claims under test: the proxy keeps rising with the KL from the initial policy while the gold
score peaks and falls; a larger KL coefficient holds the policy at a smaller KL and so nearer
the gold peak (whether the peak moves with the coefficient is the question). Every run shares
the one reward model (trained by the first run's cold start: ``reward.model.source``, from
seed 0's SFT policy) so only the policy's seed and the penalty differ. The base is the study
scale (configs/studies/arith_l1_grpo.py: arithmetic level 1, its SFT cold starts shared with the
other studies) with configs/tasks/rlhf.py's reward: the proxy optimised, the gold score and the
verifier logged.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="rlhf_overoptimization",
      config="configs/jobs/main_600_grpo.py",
      variants=independent([
          ("kl_0", {"algo.kl_coef": 0.0}),
          ("kl_0.01", {"algo.kl_coef": 0.01}),
          ("kl_0.04", {"algo.kl_coef": 0.04}),
          ("kl_0.16", {"algo.kl_coef": 0.16}),
      ]),
      seeds=(0, 1, 2),
      overrides={"reward.sources": "rm:1.0,gold:0.0,verifier:0.0",
                 # Replaced per seed by the sweep (the module docstring).
                 "reward.model.source": "run:runs/rlhf_main/rm",
                 "reward.gold.pairs": 4000,
                 "rm.train_file": "runs/rlhf_main/pairs.jsonl",
                 "rm.steps": 200, "rm.batch_size": 16, "rm.max_tokens": 64,
                 "train.steps": 150, "train.eval_every": 50},
      metrics=("final_accuracy", "final_len_mean", "final_entropy", "wall_time_s"),
      baseline="kl_0.01",
      description="KL penalty against reward over-optimisation: proxy (reward/rm) and gold "
                  "(reward/gold) reward against the KL from the initial policy.")

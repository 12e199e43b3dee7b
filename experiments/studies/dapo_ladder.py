"""DAPO's ladder (arXiv 2503.14476, table 1): GRPO -> + overlong filtering -> + clip-higher ->
+ soft overlong punishment -> + token-level loss -> + dynamic sampling.

  python -m rljax sweep experiments/studies/dapo_ladder.py

Every rung keeps the ones before it. As in DAPO, no rung has a KL term. Scaled to the study task
(28 new tokens): the soft overlong buffer is 5 tokens (DAPO: 4096 of 20480, 20%), and dynamic
sampling draws at most 3 rounds of prompts per step (it would otherwise dominate the cost when
most groups are all right or all wrong). DAPO's claim: each rung raises accuracy (AIME 30 -> 50).
"""
from rljax.sweep.study import Study, ladder


def get_study():
  return Study(
      name="dapo_ladder",
      config="configs/studies/arith_l1_grpo.py",
      overrides={"algo.kl_placement": "none"},
      variants=ladder([
          ("grpo", {}),
          ("+overlong_filter", {"algo.overlong_filter": True}),
          ("+clip_higher", {"algo.clip_eps_high": 0.28}),
          ("+soft_overlong", {"reward.overlong_buffer": 5, "reward.overlong_penalty": 1.0}),
          ("+token_loss", {"algo.loss_agg": "token_mean"}),
          ("+dynamic_sampling", {"algo.dynamic_sampling": True, "algo.max_gen_batches": 3}),
      ]),
      seeds=(0, 1, 2),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "best_accuracy", "final_entropy",
               "final_truncation_rate", "final_len_wrong", "wall_time_s"),
      baseline="grpo",
      description="DAPO's ladder: does each rung add held-out accuracy on the study task? "
                  "Differences are to plain GRPO (no KL), paired by seed.")

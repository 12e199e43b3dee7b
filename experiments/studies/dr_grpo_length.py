"""Dr. GRPO's length bias (arXiv 2503.20783): GRPO's per-sequence mean (1/|o|) gives a wrong
answer's tokens less negative weight the longer it is, so wrong answers grow; its std
normalisation up-weights nearly-solved and nearly-failed questions. Dr. GRPO removes both
(mean-centred advantages, a constant length normaliser) and should keep wrong answers short at
matched accuracy.

  python -m rljax sweep experiments/studies/dr_grpo_length.py

Both arms without KL (configs/algos/dr_grpo.py has none) so that only the two changes differ. Three
seeds first; if the interval is too wide to conclude, add seeds 3 and 4 to ``seeds`` and rerun:
only the new runs run. Needs ``len_wrong_mean`` / ``len_correct_mean`` in the
trainer's metrics (docs/ablations.md); without them the length columns read n/a and the verdict
rests on ``final_len_mean`` and the length curves.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="dr_grpo_length",
      config="configs/studies/arith_l1_grpo.py",
      overrides={"algo.kl_placement": "none"},
      variants=independent([
          ("grpo", {}),
          ("dr_grpo", {"algo.advantage": "dr_grpo", "algo.loss_agg": "seq_mean_token_sum_norm"}),
      ]),
      seeds=(0, 1, 2),
      metrics=("final_len_wrong", "final_len_correct", "final_len_mean", "final_accuracy",
               "gain_accuracy", "auc_accuracy", "final_truncation_rate"),
      baseline="grpo",
      description="Dr. GRPO vs GRPO: are wrong answers shorter at matched accuracy?")

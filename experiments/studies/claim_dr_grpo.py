"""Claim (Dr. GRPO, arXiv 2503.20783): GRPO's per-sequence mean (1/|o_i|) weighs a wrong
answer's tokens less the longer it is, so wrong answers grow; its std normalisation up-weights
nearly-solved and nearly-failed questions. Dr. GRPO (mean-centred advantages, a constant
normaliser) keeps wrong answers shorter at the same accuracy.

  python -m rljax sweep experiments/studies/claim_dr_grpo.py --root runs/studies

On the study scale (configs/studies/main_150.py: the main job's first 150 RL steps), five seeds: the
main job with GRPO's normaliser (sequence mean, std-scaled advantages) against the same with
Dr. GRPO's two changes; everything else of DAPO stays in both. The GRPO arm is the
``seq_mean`` arm of claim_token_vs_seq.py (the sweep shares it under one root). Verdict:
docs/results/claims/README.md.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="claim_dr_grpo",
      config="configs/studies/main_150.py",
      variants=independent([
          ("grpo_norm", {"algo.loss_agg": "seq_mean_token_mean"}),
          ("dr_grpo", {"algo.advantage": "dr_grpo", "algo.loss_agg": "seq_mean_token_sum_norm"}),
      ]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_len_wrong", "final_len_correct", "final_accuracy", "gain_accuracy",
               "auc_accuracy", "final_truncation_rate"),
      baseline="grpo_norm",
      description="Dr. GRPO vs GRPO's normaliser: are wrong answers shorter at matched accuracy?")

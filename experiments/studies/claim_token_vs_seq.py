"""Claim (DAPO, arXiv 2503.14476, section 3.3): a token-level loss (every token of the batch
weighs the same) learns better than GRPO's sample-level one (each completion's mean, then the
mean over completions), whose long completions' tokens weigh less, so that long wrong patterns
(repetition, rambling) are punished too little.

  python -m rljax sweep experiments/studies/claim_token_vs_seq.py --root runs/studies

On the study scale (configs/studies/main_150.py: the main job's first 150 RL steps), five seeds: the
main job (token_mean) against the same with seq_mean_token_mean. The paper's answers run to
thousands of tokens; here to 24 (reference solutions up to 21), so a length effect can only be
small. Verdict: docs/results/claims/README.md.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="claim_token_vs_seq",
      config="configs/studies/main_150.py",
      variants=independent([
          ("token_mean", {}),
          ("seq_mean", {"algo.loss_agg": "seq_mean_token_mean"}),
      ]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "final_len_wrong",
               "final_len_mean", "final_entropy"),
      baseline="token_mean",
      description="Token- vs sequence-level loss aggregation: does the token mean learn more?")

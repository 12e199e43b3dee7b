"""Dr. GRPO (arXiv 2503.20783): no std normalisation, a constant length normaliser, no KL."""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.algo.advantage = "dr_grpo"
  c.algo.loss_agg = "seq_mean_token_sum_norm"
  c.algo.kl_placement = "none"
  return c

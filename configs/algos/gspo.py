"""GSPO (arXiv 2507.18071): sequence-level ratios (GSPO-token form), tiny clip range, no KL."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "grpo"
  c.algo.policy_loss = "gspo"
  c.algo.clip_eps_low = 3e-4
  c.algo.clip_eps_high = 4e-4
  c.algo.loss_agg = "seq_mean_token_mean"
  c.algo.kl_placement = "none"
  return c

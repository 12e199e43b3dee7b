"""GPG (arXiv 2504.02546): plain policy gradient with group baselines, no reference, no KL."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "gpg"
  c.algo.policy_loss = "pg"
  c.algo.loss_agg = "token_mean"
  c.algo.kl_placement = "none"
  return c

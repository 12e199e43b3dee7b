"""GMPO (arXiv 2507.20673): geometric-mean policy optimisation, one loss per sequence, no KL."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "grpo"
  c.algo.policy_loss = "gmpo"
  c.algo.gmpo_eps = 0.4
  c.algo.kl_placement = "none"
  return c

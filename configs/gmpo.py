"""GMPO (arXiv 2507.20673): geometric-mean policy optimisation, one loss per sequence, no KL."""
from rljax.config.loader import preset


def get_config():
  c = preset(__file__)
  c.algo.advantage = "grpo"
  c.algo.policy_loss = "gmpo"
  c.algo.gmpo_eps = 0.4
  c.algo.kl_placement = "none"
  return c

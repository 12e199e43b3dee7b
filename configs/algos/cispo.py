"""CISPO (MiniMax-M1, arXiv 2506.13585): clipped, detached IS weights on a REINFORCE loss."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "grpo"
  c.algo.policy_loss = "cispo"
  c.algo.cispo_eps_high = 4.0
  c.algo.loss_agg = "token_mean"
  c.algo.kl_placement = "none"
  return c

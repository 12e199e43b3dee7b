"""RLOO (arXiv 2402.14740): leave-one-out baseline, REINFORCE, k1 KL in the reward."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "rloo"
  c.algo.policy_loss = "pg"
  c.algo.kl_placement = "reward"
  c.algo.kl_estimator = "k1"
  c.algo.kl_coef = 0.01
  return c

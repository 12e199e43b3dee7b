"""Open-Reasoner-Zero (arXiv 2503.24290): vanilla PPO, GAE with gamma = lam = 1, no KL at all."""
from rljax.config.loader import based_on, reset


def get_config():
  c = based_on("algos/ppo.py")
  c.algo.lam = 1.0
  c.algo.kl_placement = "none"
  reset(c, "algo.kl_coef", "algo.kl_estimator")  # PPO's KL-in-reward settings, now unread
  c.critic.lr = 5 * c.optim.lr
  return c

"""Open-Reasoner-Zero (arXiv 2503.24290): vanilla PPO, GAE with gamma = lam = 1, no KL at all."""
from rljax.config_loader import preset


def get_config():
  c = preset(__file__, "ppo.py")
  c.algo.lam = 1.0
  c.algo.kl_placement = "none"
  c.critic.lr = 5 * c.optim.lr
  return c

"""VC-PPO (arXiv 2503.01491): PPO with value pretraining and decoupled GAE (0.95 / 1.0)."""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/ppo.py")
  c.critic.pretrain_steps = 50
  c.algo.lam = 0.95
  c.algo.lam_critic = 1.0
  return c

"""T1 (arXiv 2501.11651): RLOO with oversampling at a high temperature, an entropy bonus, an EMA
reference ("dynamic anchor") and per-token normalised KL."""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/rloo.py")
  c.algo.policy_loss = "ppo"
  c.rollout.group_size = 16
  c.rollout.temperature = 1.2
  c.algo.entropy_coef = 0.001
  c.algo.ref_update = "ema"
  c.algo.ref_ema_decay = 0.99
  c.algo.kl_placement = "loss"
  c.algo.kl_estimator = "k3"
  c.algo.kl_coef = 0.01
  c.algo.kl_normalize = True
  return c

"""VAPO (arXiv 2504.05118): VC-PPO + length-adaptive GAE, clip-higher, token-level loss,
positive-example LM loss and group sampling."""
from rljax.config.loader import based_on, reset


def get_config():
  c = based_on("algos/vc_ppo.py")
  c.algo.lam_alpha = 0.05
  c.algo.clip_eps_low = 0.2
  c.algo.clip_eps_high = 0.28
  c.algo.loss_agg = "token_mean"
  c.algo.pos_lm_coef = 0.1
  c.algo.kl_placement = "none"
  reset(c, "algo.kl_coef", "algo.kl_estimator")  # PPO's KL-in-reward settings, now unread
  c.rollout.group_size = 8
  return c

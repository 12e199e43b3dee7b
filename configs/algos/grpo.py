"""GRPO (DeepSeekMath, arXiv 2402.03300): group z-score advantages, k3 KL in the loss."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "grpo"
  c.algo.adv_std = "group"
  c.algo.policy_loss = "ppo"
  c.algo.clip_eps_low = c.algo.clip_eps_high = 0.2
  c.algo.kl_placement = "loss"
  c.algo.kl_estimator = "k3"
  c.algo.kl_coef = 0.04
  c.algo.loss_agg = "seq_mean_token_mean"
  c.rollout.group_size = 8
  return c

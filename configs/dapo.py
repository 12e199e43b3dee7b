"""DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, token-level loss, overlong shaping."""
from rljax.config_loader import preset


def get_config():
  c = preset(__file__)
  c.algo.advantage = "grpo"
  c.algo.policy_loss = "ppo"
  c.algo.clip_eps_low = 0.2
  c.algo.clip_eps_high = 0.28
  c.algo.loss_agg = "token_mean"
  c.algo.kl_placement = "none"
  c.algo.dynamic_sampling = True
  c.algo.max_gen_batches = 10
  c.reward.overlong_buffer = c.rollout.max_new_tokens // 4
  c.reward.overlong_penalty = 1.0
  c.rollout.group_size = 16
  return c

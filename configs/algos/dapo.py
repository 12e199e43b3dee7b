"""DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, token-level loss, overlong shaping."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "grpo"
  c.algo.policy_loss = "ppo"
  c.algo.clip_eps_low = 0.2
  c.algo.clip_eps_high = 0.28
  c.algo.loss_agg = "token_mean"
  c.algo.kl_placement = "none"
  c.algo.dynamic_sampling = True
  c.algo.max_gen_batches = 10
  # 16 tokens, a quarter of the base budget of 64 (lengths count the stop token). It is a number,
  # not a formula: when you change rollout.max_new_tokens, set reward.overlong_buffer too.
  c.reward.overlong_buffer = 16
  c.reward.overlong_penalty = 1.0
  c.rollout.group_size = 16
  return c

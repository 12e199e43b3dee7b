"""PPO (arXiv 1707.06347) as used for RLHF: a critic, GAE, KL to the reference in the reward."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.critic.enabled = True
  c.critic.lr = 1e-5
  c.algo.advantage = "gae"
  c.algo.gamma = 1.0
  c.algo.lam = 0.95
  c.algo.adv_whiten = True
  c.algo.policy_loss = "ppo"
  c.algo.clip_eps_low = c.algo.clip_eps_high = 0.2
  c.algo.kl_placement = "reward"
  c.algo.kl_estimator = "k1"
  c.algo.kl_coef = 0.001
  c.algo.loss_agg = "seq_mean_token_mean"
  return c

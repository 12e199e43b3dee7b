"""REINFORCE++ (arXiv 2501.03262): token rewards with KL, returns-to-go, batch whitening."""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.algo.advantage = "reinforce_pp"
  c.algo.policy_loss = "ppo"
  c.algo.clip_eps_low = c.algo.clip_eps_high = 0.2
  c.algo.kl_placement = "reward"
  c.algo.kl_estimator = "k1"
  c.algo.kl_coef = 0.01
  return c

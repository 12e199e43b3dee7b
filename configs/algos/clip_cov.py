"""Clip-Cov (arXiv 2505.22617): zero the loss of a random 2e-4 of the minibatch's tokens whose
log-prob/advantage covariance lies in (1, 5), against entropy collapse.

The authors' recipe (verl ``recipe/entropy/*_clip_cov.sh``): GRPO advantages, ``token_mean``, no
KL, no entropy bonus, G = 8, PPO clip eps 1.0 on both sides (docs/algorithms.md).
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.algo.policy_loss = "clip_cov"
  c.algo.clip_cov_ratio = 2e-4
  c.algo.clip_cov_lb = 1.0
  c.algo.clip_cov_ub = 5.0
  c.algo.clip_eps_low = c.algo.clip_eps_high = 1.0
  c.algo.loss_agg = "token_mean"
  c.algo.kl_placement = "none"
  return c

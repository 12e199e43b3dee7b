"""KL-Cov (arXiv 2505.22617): an unclipped policy gradient plus ``|log r|`` on the top 2e-3 of the
minibatch's tokens by log-prob/advantage covariance, against entropy collapse.

The authors' 7B recipe (verl ``recipe/entropy/7b_kl_cov.sh``): GRPO advantages, ``token_mean``,
no KL to a reference, no entropy bonus, G = 8, ratio 2e-3, coefficient 1 (docs/algorithms.md).
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.algo.policy_loss = "kl_cov"
  c.algo.kl_cov_ratio = 2e-3
  c.algo.kl_cov_coef = 1.0
  c.algo.loss_agg = "token_mean"
  c.algo.kl_placement = "none"
  return c

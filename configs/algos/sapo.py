"""SAPO (arXiv 2511.20347): GRPO with a soft sigmoid gate on the ratio instead of PPO's clip.

Temperatures as in the paper, verl and TRL (tau_neg > tau_pos damps negative updates faster);
the objective forces ``seq_mean_token_mean`` (docs/algorithms.md).
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.algo.policy_loss = "sapo"
  c.algo.sapo_tau_pos = 1.0
  c.algo.sapo_tau_neg = 1.05
  c.algo.sapo_level = "token"
  return c

"""ReMax (arXiv 2310.10505): REINFORCE with the reward of one greedy completion per prompt as the
baseline; no critic, no normalisation, one sample per prompt (docs/algorithms.md).
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.algo.advantage = "remax"
  c.rollout.group_size = 1
  return c

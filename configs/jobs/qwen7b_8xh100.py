"""Plan: Qwen2.5-7B GRPO on one node of 8 x H100 80 GB, pure FSDP.

  python -m rljax plan --config configs/jobs/qwen7b_8xh100.py

The v5p-64 plan (configs/jobs/qwen7b_v5p64.py) with a GPU node's batch and device.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("jobs/qwen7b_v5p64.py")
  c.rollout.prompts_per_step = 32
  c.rollout.group_size = 8  # 256 completions per step
  c.rollout.max_new_tokens = 3072
  c.algo.micro_batches = 8  # 256 / 4 / 8 = 8 rows per micro-batch = 1 per GPU
  c.mesh.fsdp = -1  # 8
  c.plan.device = "8xh100-80g"
  return c

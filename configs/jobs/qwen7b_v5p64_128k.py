"""Plan: Qwen2.5-7B GRPO at 128k tokens a row on a TPU v5p-64 slice (32 chips): every row split
over 8 chips (``mesh.context=8``, striped ring attention and a striped KV cache), FSDP over
the 4 groups of 8 (the weights over fsdp x context = 32 ways).

  python -m rljax plan --config configs/jobs/qwen7b_v5p64_128k.py

Without the context axis one chip holds a whole 128k row: 85 GiB of activations and 112 GiB of
KV cache, 212 GiB in all (docs/scale_out.md, "Long context"). The rows per micro-batch stay one
per batch shard (4 rows = 1 per group of 8 chips, 16k tokens a chip).
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("jobs/qwen7b_v5p64.py")
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8  # 64 completions per step
  c.rollout.max_new_tokens = 131072 - 1024  # 1024 prompt + 130048 new = 128k slots a row
  c.algo.minibatches = 4
  c.algo.micro_batches = 4  # 64 / 4 / 4 = 4 rows a micro-batch = 1 per batch shard
  c.mesh.fsdp = 4
  c.mesh.context = 8  # 32 chips = fsdp 4 x context 8
  return c

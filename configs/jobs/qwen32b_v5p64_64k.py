"""Plan: Qwen2.5-32B GRPO at 64k tokens a row on a TPU v5p-64 slice (32 chips): every row split
over 8 chips (``mesh.context=8``), heads over 2 (``mesh.tensor=2``: the sampler's gathered
weights and the KV cache's heads halve), FSDP over the remaining 2.

  python -m rljax plan --config configs/jobs/qwen32b_v5p64_64k.py

The 7B files beside it, with the 32B architecture (``plan.model``) and tensor parallelism: a 64k row of
the 32B's cache is 16 GiB (64 layers x 8 kv heads), 2 GiB a chip once split 8 ways.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("jobs/qwen7b_v5p64_128k.py")
  c.model.source = "hf:/models/Qwen2.5-32B-Instruct"  # override with the real directory
  c.data.tokenizer = "/models/Qwen2.5-32B-Instruct"
  c.rollout.max_new_tokens = 65536 - 1024
  c.rollout.prompts_per_step = 4  # 32 completions per step
  c.algo.micro_batches = 4  # 32 / 4 / 4 = 2 rows a micro-batch = 1 per batch shard
  c.mesh.fsdp = 2
  c.mesh.tensor = 2  # 32 chips = fsdp 2 x context 8 x tensor 2
  c.plan.model = "qwen2.5-32b"
  return c

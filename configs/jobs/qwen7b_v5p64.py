"""Plan: Qwen2.5-7B GRPO on a TPU v5p-64 slice (64 TensorCores = 32 chips, 8 hosts), pure FSDP.

  python -m rljax plan --config configs/jobs/qwen7b_v5p64.py

The same file launches the run once ``model.source`` points at the weights (see
docs/scale_out.md); ``plan.*`` is read only by ``rljax plan``.
"""
import ml_collections

from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.model.source = "hf:/models/Qwen2.5-7B-Instruct"  # override with the real directory
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "bfloat16"
  c.model.remat = "full"
  c.model.logits_chunk = 512
  c.data.tokenizer = "/models/Qwen2.5-7B-Instruct"
  c.data.chat_template = True
  c.data.prompt_bucket = 128

  c.rollout.prompts_per_step = 64
  c.rollout.group_size = 8  # 512 completions per step
  c.rollout.max_new_tokens = 4096
  c.algo.minibatches = 4
  c.algo.micro_batches = 4  # 512 / 4 / 4 = 32 rows per micro-batch = 1 per chip

  c.mesh.data = 1
  c.mesh.fsdp = -1  # 32
  c.mesh.tensor = 1

  with c.unlocked():  # plan.* is read only by `rljax plan`, not a key of the table
    c.plan = ml_collections.ConfigDict()
    c.plan.model = "qwen2.5-7b"
    c.plan.device = "v5p-64"
    c.plan.prompt_len = 1024
  return c

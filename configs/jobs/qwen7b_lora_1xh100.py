"""Plan: Qwen2.5-7B GRPO with LoRA (rank 64, every projection) on ONE H100 80 GB at 8k tokens.

  python -m rljax plan --config configs/jobs/qwen7b_lora_1xh100.py
  python -m rljax plan --config configs/jobs/qwen7b_lora_1xh100.py --config.model.lora.rank=0 --config.model.lora.base_dtype=param

The second line is the same run as a full fine-tune (float32 master weights and AdamW state, a
reference copy): it does not fit. With adapters the base is frozen in bfloat16
(``model.lora.base_dtype='compute'``), only the adapters have gradients and optimizer state, and
the reference is the base itself (docs/lora.md).
"""
import ml_collections

from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "hf:/models/Qwen2.5-7B-Instruct"  # override with the real directory
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"  # the adapters' (and a full fine-tune's) master weights
  c.model.remat = "full"
  c.model.lora.rank = 64
  c.model.lora.base_dtype = "compute"
  c.data.tokenizer = "/models/Qwen2.5-7B-Instruct"
  c.data.chat_template = True

  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8  # 64 completions per step
  c.rollout.engine = "continuous"
  c.rollout.max_concurrent_rows = 32  # the KV cache of 32 rows of 8k at a time
  c.rollout.max_new_tokens = 7168  # + 1024 prompt tokens = 8k per row
  c.algo.minibatches = 4
  c.algo.micro_batches = 16  # 64 / 4 / 16 = 1 row of 8k tokens per micro-batch

  with c.unlocked():
    c.plan = ml_collections.ConfigDict()
    c.plan.model = "qwen2.5-7b"
    c.plan.device = "1xh100-80g"
    c.plan.prompt_len = 1024
  return c

"""Plan: Qwen2.5-7B GRPO on one node of 8 x H100 80 GB, pure FSDP.

  python -m rljax plan --config experiments/plans/qwen7b_8xh100.py

The same file launches the run once ``model.source`` points at the weights (see
docs/scale_out.md); ``plan.*`` is read only by ``rljax plan``.
"""
import importlib.util
import os

import ml_collections


def _base():
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "base.py")
  spec = importlib.util.spec_from_file_location("rljax_base_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config():
  c = _base()
  c.model.source = "hf:/models/Qwen2.5-7B-Instruct"  # override with the real directory
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "bfloat16"
  c.model.remat = True
  c.model.logits_chunk = 512
  c.data.tokenizer = "/models/Qwen2.5-7B-Instruct"
  c.data.chat_template = True
  c.data.prompt_bucket = 128

  c.rollout.prompts_per_step = 32
  c.rollout.group_size = 8  # 256 completions per step
  c.rollout.max_new_tokens = 3072
  c.algo.minibatches = 4
  c.algo.micro_batches = 8  # 256 / 4 / 8 = 8 rows per micro-batch = 1 per GPU

  c.mesh.data = 1
  c.mesh.fsdp = -1  # 8
  c.mesh.tensor = 1

  c.plan = ml_collections.ConfigDict()
  c.plan.model = "qwen2.5-7b"
  c.plan.device = "8xh100-80g"
  c.plan.prompt_len = 1024
  return c

"""Run with 8 simulated CPU devices (XLA_FLAGS set by the test): score one batch with the reward
model source on meshes of 8 devices and on one device. Prints one JSON line per mesh."""
import json
import sys
import tempfile

import jax

jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402

from rljax import models  # noqa: E402
from rljax.data.tokenizer import CharTokenizer  # noqa: E402
from rljax.config.table import get_config  # noqa: E402
from rljax.models.config import ModelConfig  # noqa: E402
from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax.rewards import reward_model, sources  # noqa: E402
from rljax.loading import loader  # noqa: E402

assert jax.device_count() == 8, jax.devices()

CFG = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, tie_embeddings=False,
                  model_type="qwen2", pad_token_id=0)
ROWS, P, T = 12, 6, 8  # 12 rows: chunks of 8 leave a padded last chunk


def batch():
  rng = np.random.default_rng(0)
  tok = CharTokenizer()
  prompt_tokens = rng.integers(3, tok.vocab_size, (ROWS, P)).astype(np.int32)
  tokens = rng.integers(3, tok.vocab_size, (ROWS, T)).astype(np.int32)
  prompt_len, completion_len = rng.integers(1, P + 1, ROWS), rng.integers(1, T + 1, ROWS)
  prompt_mask = (np.arange(P)[None] >= P - prompt_len[:, None]).astype(np.int32)
  mask = (np.arange(T)[None] < completion_len[:, None]).astype(np.int32)
  return sources.RewardBatch(prompts=[""] * ROWS, completions=[""] * ROWS,
                             problems=[None] * ROWS, prompt_tokens=prompt_tokens * prompt_mask,
                             prompt_mask=prompt_mask, tokens=tokens * mask, mask=mask)


def main(meshes):
  params = models.init_params(CFG, seed=0, head="score")
  params["score"]["kernel"] = params["score"]["kernel"] * 50.0  # scores of order 1
  path = tempfile.mkdtemp()
  models.save_hf(path, CFG, params)
  config = get_config()
  config.reward.model.source = f"hf:{path}"
  config.reward.model.tokenizer = "char"
  config.reward.model.batch_size = 8
  config.model.dtype = "float32"
  rows = batch()
  one = mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  ref = loader.reward_model(config, CharTokenizer(), one)(rows)
  for spec in meshes:
    data, fsdp, tensor = map(int, spec.split(","))
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = data, fsdp, tensor
    mesh = mesh_lib.make_mesh(config.mesh)
    rm = loader.reward_model(config, CharTokenizer(), mesh)
    scores = rm(rows)
    q = rm.params["layers_0"]["self_attn"]["q_proj"]["kernel"]
    print(json.dumps({"mesh": [data, fsdp, tensor], "diff": float(np.abs(scores - ref).max()),
                      "spread": float(np.std(ref)), "q_spec": str(q.sharding.spec),
                      "devices": len(q.sharding.device_set), "rows": len(scores)}), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])

"""Helpers shared by the benchmark scripts."""
import jax

from rljax.models import ModelConfig

# Llama-architecture benchmark models (MHA): 1M, 6M (the sampler benchmark) and a ~50M one.
MODELS = {
    "1M": dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
    "6M": dict(hidden_size=256, num_layers=6, num_heads=4, intermediate_size=1024),
    "50M": dict(hidden_size=640, num_layers=10, num_heads=10, intermediate_size=2048),
}


def model_config(name: str, vocab: int, max_positions: int = 1024) -> ModelConfig:
  m = MODELS[name]
  return ModelConfig(vocab_size=vocab, num_kv_heads=m["num_heads"],
                     head_dim=m["hidden_size"] // m["num_heads"],
                     max_position_embeddings=max_positions, **m)


def matmul_precisions(torch) -> str:
  """The float32 matmul precision each framework uses on a GPU (None: XLA's default, TF32)."""
  jp = getattr(jax.config, "jax_default_matmul_precision", "?")
  try:
    tp = (f"allow_tf32={torch.backends.cuda.matmul.allow_tf32} (float32_matmul_precision="
          f"{torch.get_float32_matmul_precision()})")
  except Exception as e:  # noqa: BLE001 (an API that moved: report it, do not fail)
    tp = f"? ({type(e).__name__}: {e})"
  return f"jax_default_matmul_precision={jp}, torch {tp}"

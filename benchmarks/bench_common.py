"""Helpers shared by the benchmark scripts."""
import time

import jax
import jax.numpy as jnp
import numpy as np

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


def matmul_flops(n: int = 2048, reps: int = 5, gpu: bool = False) -> dict:
  """FLOP/s of an ``n x n`` float32 matmul, the best of ``reps``, with XLA and with torch."""
  if gpu:
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  else:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
  mm = jax.jit(lambda x, y: x @ y)
  mm(a, a).block_until_ready()
  best = min(_seconds(lambda: mm(a, a).block_until_ready()) for _ in range(reps))
  out = {"xla": 2 * n ** 3 / best}
  del a
  import torch
  if gpu:
    x = torch.randn(n, n, device="cuda")

    def torch_mm():
      x @ x
      torch.cuda.synchronize()
  else:
    x = torch.randn(n, n)

    def torch_mm():
      x @ x
  torch_mm()
  out["torch"] = 2 * n ** 3 / min(_seconds(torch_mm) for _ in range(reps))
  del x
  return out


def _seconds(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def timed(fn, n: int) -> tuple[float, list[float]]:
  """(seconds of a first call of ``fn``, seconds of each of the ``n`` calls after it)."""
  first = _seconds(fn)
  return first, [_seconds(fn) for _ in range(n)]

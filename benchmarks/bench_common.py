"""Helpers shared by the benchmark scripts."""
import jax


def matmul_precisions(torch) -> str:
  """The float32 matmul precision each framework uses on a GPU (None: XLA's default, TF32)."""
  jp = getattr(jax.config, "jax_default_matmul_precision", "?")
  try:
    tp = (f"allow_tf32={torch.backends.cuda.matmul.allow_tf32} (float32_matmul_precision="
          f"{torch.get_float32_matmul_precision()})")
  except Exception as e:  # noqa: BLE001 (an API that moved: report it, do not fail)
    tp = f"? ({type(e).__name__}: {e})"
  return f"jax_default_matmul_precision={jp}, torch {tp}"

"""Random inputs with the edge cases the sheet cares about (not a reference implementation)."""
import jax
import numpy as np


def prefix_mask(rng, batch, length, dtype=np.float32):
  """``[B, T]`` right-padded masks whose lengths include 0, 1 and T."""
  lengths = rng.integers(0, length + 1, size=batch)
  special = [0, 1, length]
  lengths[:len(special)] = special[:batch]
  rng.shuffle(lengths)
  return (np.arange(length)[None, :] < lengths[:, None]).astype(dtype)


def group_rewards(rng, num_prompts, group_size, dtype):
  """``[P * G]`` rewards: binary groups (one all-correct, one all-wrong) and continuous groups."""
  rewards = rng.integers(0, 2, size=(num_prompts, group_size)).astype(np.float64)
  rewards[0] = 1.0
  if num_prompts > 1:
    rewards[1] = 0.0
  if num_prompts > 2:
    rewards[2:] = rng.normal(size=(num_prompts - 2, group_size))
  if num_prompts > 3:
    rewards[3] = 0.1  # equal non-binary values: their mean is not bitwise 0.1
  return rewards.reshape(-1).astype(dtype)


def log_ratios(rng, shape):
  """``logp - old_logp`` mixing near-on-policy values, large ratios and values beyond the clamp."""
  delta = rng.normal(scale=0.3, size=shape)
  pick = rng.random(shape)
  delta = np.where(pick < 0.1, rng.uniform(2.0, 8.0, shape) * rng.choice([-1, 1], shape), delta)
  delta = np.where(pick > 0.95, rng.uniform(21.0, 30.0, shape) * rng.choice([-1, 1], shape), delta)
  return delta


def cast(dtype, *arrays):
  return tuple(np.asarray(a).astype(dtype) for a in arrays)


# Tiny test graphs spend most of their time in the XLA CPU compiler; skip its expensive LLVM
# passes (codegen only, the same HLO; results differ from the optimized build by float rounding).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def jit(fn, **kwargs):
  """``jax.jit`` with cheap compilation, for test-sized inputs."""
  return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


def central_difference(f, x, eps=1e-6):
  """Central finite differences of a scalar ``f`` at every entry of the float64 array ``x``."""
  grad = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[idx] += eps
    down[idx] -= eps
    grad[idx] = (f(up) - f(down)) / (2 * eps)
  return grad

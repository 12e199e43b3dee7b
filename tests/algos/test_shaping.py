"""DAPO reward shaping (ALGORITHMS.md section 1): soft overlong punishment, overlong filtering."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rewards import shaping

from .helpers import jit


def np_overlong(lengths, max_new_tokens, buffer, penalty):
  out = []
  for n in lengths:
    if buffer == 0 or n <= max_new_tokens - buffer:
      out.append(0.0)
    elif n <= max_new_tokens:
      out.append(((max_new_tokens - buffer) - n) / buffer * penalty)
    else:
      out.append(-penalty)
  return np.array(out)


@pytest.mark.parametrize("host", [False, True], ids=["jit", "numpy"])
@pytest.mark.parametrize("buffer,penalty", [(0, 1.0), (8, 1.0), (16, 0.5), (32, 2.0)])
def test_soft_overlong_punishment_in_tokens(x64, buffer, penalty, host):
  """Traced, and on NumPy lengths as the host rollout calls it (NumPy out, no JAX op)."""
  lengths = np.array([0, 1, 15, 16, 17, 20, 24, 31, 32, 33, 40])
  fn = lambda n: shaping.overlong_penalty(n, max_new_tokens=32, overlong_buffer=buffer,
                                          overlong_penalty=penalty)
  got = fn(lengths) if host else jit(fn)(lengths)
  assert isinstance(got, np.ndarray) == host
  np.testing.assert_allclose(np.asarray(got), np_overlong(lengths, 32, buffer, penalty),
                             rtol=1e-12, atol=1e-15)


def test_overlong_buffer_is_validated():
  with pytest.raises(ValueError, match="reward.overlong_buffer"):
    shaping.overlong_penalty(jnp.ones(2), max_new_tokens=8, overlong_buffer=9,
                             overlong_penalty=1.0)


def test_overlong_filter_masks_truncated_rows_only():
  mask = np.ones((3, 4), np.float32)
  mask[1, 2:] = 0
  out = np.asarray(jit(shaping.overlong_filter_mask)(mask, np.array([0, 1, 1])))
  np.testing.assert_array_equal(out, np.stack([mask[0], np.zeros(4), np.zeros(4)]))
  assert out.dtype == np.float32

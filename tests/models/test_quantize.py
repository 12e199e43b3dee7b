"""Per-channel FP8 weight quantisation (``rljax.models.quantize``) against ``ml_dtypes``' float8
rounding in NumPy, its error bound, and which parameters of a tiny Qwen3-MoE it touches."""
import jax
import ml_dtypes
import numpy as np
import pytest

from rljax.models import quantize, transformer
from rljax.models.config import ModelConfig

FP8 = "float8_e4m3fn"


def _np_quantize(w):
  """The module docstring's formula in NumPy: absmax per output channel over the input axis."""
  absmax = np.abs(w).max(axis=-2, keepdims=True)
  scale = np.where(absmax > 0, absmax / 448.0, 1.0).astype(np.float32)
  return (w / scale).astype(ml_dtypes.float8_e4m3fn), scale


def test_matches_numpy_float8_rounding_and_error_bound():
  rng = np.random.default_rng(0)
  # Channels of very different magnitudes, one all zero, and an expert axis in front.
  w = (rng.normal(size=(3, 16, 8)) * np.logspace(-3, 2, 8)).astype(np.float32)
  w[1, :, 5] = 0.0
  q, scale = quantize.quantize_per_channel(jax.numpy.asarray(w), FP8)
  _, want_scale = _np_quantize(w)
  assert q.dtype == jax.numpy.float8_e4m3fn and scale.shape == (3, 1, 8)
  np.testing.assert_allclose(np.asarray(scale), want_scale, rtol=3e-7)  # x / 448: XLA may
  # multiply by the reciprocal, so compare the rounding itself at the computed scale.
  got_q = np.asarray(q, np.float32)
  np.testing.assert_array_equal(got_q, (w / np.asarray(scale)).astype(ml_dtypes.float8_e4m3fn)
                                .astype(np.float32))
  back = np.asarray(quantize.dequantize(q, scale, "float32"))
  # 3 mantissa bits: half a unit in the last place is 2^-4 of a normal value; below the
  # smallest normal (2^-6) the spacing is the subnormal step 2^-9, times the channel's scale.
  bound = 2.0 ** -4 * np.abs(w) + 2.0 ** -10 * want_scale
  assert (np.abs(back - w) <= bound).all()
  assert not back[1, :, 5].any()
  # Each channel's largest magnitude maps to 448 exactly.
  np.testing.assert_allclose(np.abs(back).max(axis=-2), np.abs(w).max(axis=-2), rtol=1e-6)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="float8_e4m3fn"):
    quantize.quantize_per_channel(jax.numpy.ones((2, 2)), "int4")
  with pytest.raises(ValueError, match="rank >= 2"):
    quantize.quantize_per_channel(jax.numpy.ones(4), FP8)


def test_round_trip_touches_the_projection_and_expert_kernels_only():
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, model_type="qwen3_moe",
                    num_experts=4, experts_per_token=2, moe_intermediate_size=16,
                    moe_layers=(1,))
  params = transformer.init_params(cfg, seed=0)
  out = quantize.round_trip_weights(params, FP8)
  changed = set()
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(out)):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    a, b = np.asarray(a), np.asarray(b)
    assert b.dtype == a.dtype, name
    if not np.array_equal(a, b):
      changed.add(name)
      q, scale = _np_quantize(a)
      np.testing.assert_allclose(b, q.astype(np.float32) * scale, rtol=2e-6, atol=0,
                                 err_msg=name)
  projections = {f"layers_{i}/self_attn/{n}_proj/kernel" for i in (0, 1) for n in "qkvo"}
  mlps = {f"layers_0/mlp/{n}_proj/kernel" for n in ("gate", "up", "down")}
  experts = {f"layers_1/mlp/{n}_proj" for n in ("gate", "up", "down")}  # not the router
  assert changed == projections | mlps | experts

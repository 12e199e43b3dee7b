"""``model.scan_layers``: the cache-free forward as a ``lax.scan`` over stacked layer weights.

It must compute what the unrolled layer loop computes (itself checked against ``transformers``
in test_hf_parity.py), leave the parameter tree alone, and make remat save memory where the
unrolled loop does not (XLA:CPU merges the unrolled recomputation back into the forward).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models import ModelConfig, transformer
from tests.models.test_long_sequence import _loss  # the policy-gradient path, one definition

# Tiny, with GQA (4/2), two blocks of 4 for the blockwise attention, and left padding.
CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
                  num_kv_heads=2, head_dim=8, attention="blockwise", attention_block=4)
T = 12


@pytest.fixture(scope="module")
def inputs():
  params = transformer.init_params(CFG, seed=1)
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 64, (2, T)), jnp.int32)
  mask = jnp.ones((2, T), jnp.int32).at[0, :5].set(0).at[1, :1].set(0)
  return params, tokens, mask


def _rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@functools.partial(jax.jit, static_argnums=0)
def _logits_and_grad(cfg, params, tokens, mask):
  """Logits and the gradient of a loss that touches every position (masked-mean squared)."""
  def loss(p):
    out = transformer.logits(cfg, p, tokens, mask)
    return ((out * mask[..., None]) ** 2).mean(), out
  (_, out), grad = jax.value_and_grad(loss, has_aux=True)(params)
  return out, grad


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_scanned_forward_and_gradient_equal_unrolled(inputs, remat):
  params, tokens, mask = inputs
  cfg = CFG.replace(remat=remat)
  want_logits, want_grad = _logits_and_grad(cfg, params, tokens, mask)
  got_logits, got_grad = _logits_and_grad(cfg.replace(scan_layers=True), params, tokens, mask)
  assert float(jnp.abs(got_logits - want_logits).max()) <= 1e-6
  assert jax.tree.structure(got_grad) == jax.tree.structure(params)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grad),
                          jax.tree.leaves(want_grad)):
    assert _rel_err(g, w) <= 1e-5, jax.tree_util.keystr(path)
  # Every layer's gradient is non-zero: the stacked weights really reach each layer.
  for i in range(CFG.num_layers):
    assert float(jnp.abs(got_grad[f"layers_{i}"]["mlp"]["down_proj"]["kernel"]).max()) > 0


@functools.partial(jax.jit, static_argnums=0)
def _values(cfg, params, tokens, mask):
  return transformer.bind(cfg, params, "value").values(
      transformer.forward(cfg, params, tokens, mask, head="value"))


def test_value_head_scanned_equals_unrolled(inputs):
  _, tokens, mask = inputs
  params = transformer.init_params(CFG, seed=2, head="value")
  want = _values(CFG, params, tokens, mask)
  got = _values(CFG.replace(scan_layers=True), params, tokens, mask)
  assert got.shape == (2, T)
  assert float(jnp.abs(got - want).max()) <= 1e-6


def test_scan_leaves_parameter_tree_and_cached_path_alone(inputs):
  """Same parameter tree (HF import/export, checkpoints, rules); the cached prefill still runs the
  loop and matches the cache-free scanned forward on the valid positions."""
  params, tokens, mask = inputs
  scan = CFG.replace(scan_layers=True)
  assert jax.tree.structure(transformer.param_shapes(scan)) == jax.tree.structure(params)
  assert transformer.logical_axes(scan) == transformer.logical_axes(CFG)
  prefill = jax.jit(functools.partial(transformer.cached_step, scan), static_argnums=4)
  hidden, new_cache = prefill(params, tokens, transformer.positions_from_mask(mask),
                              transformer.init_cache(scan, 2, T), 0, mask)
  assert len(new_cache) == CFG.num_layers
  full = jax.jit(functools.partial(transformer.forward, scan))(params, tokens, mask)
  valid = np.asarray(mask, bool)
  assert float(np.abs(np.asarray(hidden - full))[valid].max()) <= 1e-5


def test_scan_layers_rejects_non_bool():
  with pytest.raises(ValueError, match="model.scan_layers"):
    CFG.replace(scan_layers="yes")


# --- memory: remat saves under scan, not unrolled ------------------------------------------------

MEM_CFG = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=16, attention="blockwise")
MEM_T = 1024


def _temp_bytes(cfg):
  spec = jax.ShapeDtypeStruct((1, MEM_T), jnp.int32)
  params = jax.eval_shape(functools.partial(transformer.init_params, cfg))
  compiled = jax.jit(jax.grad(functools.partial(_loss, cfg))).lower(params, spec, spec).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_remat_saves_memory_only_with_scanned_layers():
  """XLA's temporaries of the loss gradient (4 layers, T=1024), measured: scan full / scan none
  0.31, scan full / unrolled none 0.35, unrolled full / unrolled none 0.94 (the unrolled
  recomputation is merged back into the forward; docs/results/benchmarks/long_sequence.md, issue 16)."""
  scan = {r: _temp_bytes(MEM_CFG.replace(remat=r, scan_layers=True)) for r in ("none", "full")}
  unrolled = {r: _temp_bytes(MEM_CFG.replace(remat=r)) for r in ("none", "full")}
  assert scan["full"] <= 0.5 * scan["none"], scan
  assert scan["full"] <= 0.5 * unrolled["none"], (scan, unrolled)
  # The bound the unrolled layout fails: the measure can tell the layouts apart.
  assert unrolled["full"] > 0.8 * unrolled["none"], unrolled

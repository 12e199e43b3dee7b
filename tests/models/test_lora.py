"""Low-rank adapters (``rljax.models.lora``) in the forward of every family and every MoE dispatch:
at initialisation (B = 0) the adapted model is its base bit for bit; with non-zero adapters its
forward equals the base forward on kernels merged by a NumPy ``W + (alpha/r) A @ B``. Tiny
shapes (the parity tests' architectures), one compiled forward per family and layout."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.errors import ConfigError
from rljax.models import ModelConfig, lora, moe, transformer
from tests import hf_models

FAMILIES = ("llama", "qwen3", "gemma3", "qwen3_moe")
RANK, ALPHA = 4, 8.0


def _cfg(name, **lora_fields):
  fields = dict(lora_rank=RANK, lora_alpha=ALPHA, lora_targets=("all",))
  fields.update(lora_fields)
  return ModelConfig.from_hf_dict(hf_models.hf_config(name).to_dict(), **fields)


@functools.partial(jax.jit, static_argnums=0)
def _logits(cfg, params, tokens, mask):
  return transformer.logits(cfg, params, tokens, mask)


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, hf_models.VOCAB, size=(2, 7)).astype(np.int32)
  mask = np.ones((2, 7), np.int32)
  mask[1, :2] = 0  # a left-padded row
  return tokens, mask


def _random_adapters(adapters, seed=1, std=0.2):
  """Every factor random (B too), so the adapters change the forward."""
  leaves, treedef = jax.tree.flatten(adapters)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(treedef, [jnp.asarray(std * rng.normal(size=x.shape), x.dtype)
                                      for x in leaves])


def _np_merge(params, scale):
  """The base layout of ``params`` by the formula, in float64 NumPy: each kernel ``W`` plus
  ``scale * A @ B`` of its factors (a leading expert axis batched), the factors dropped."""
  out = {}
  for name, value in params.items():
    if lora.is_adapter(name):
      continue
    if isinstance(value, dict):
      out[name] = _np_merge(value, scale)
      continue
    a = params.get("lora_a" if name == "kernel" else f"{name}_lora_a")
    b = params.get("lora_b" if name == "kernel" else f"{name}_lora_b")
    w = np.asarray(value, np.float64)
    if a is not None:
      w = w + scale * np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    out[name] = w.astype(np.asarray(value).dtype)
  return out


@pytest.mark.parametrize("name", FAMILIES)
def test_adapted_forward_is_the_base_at_init_and_the_merged_base_after(name):
  cfg = _cfg(name)
  tokens, mask = _batch()
  params = transformer.init_params(cfg, seed=3)
  base, adapters = lora.split_adapters(params)
  # The base of an adapted model is the rank-0 model of the same seed, bit for bit.
  reference = transformer.init_params(cfg.base, seed=3)
  assert jax.tree.structure(base) == jax.tree.structure(reference)
  for x, y in zip(jax.tree.leaves(base), jax.tree.leaves(reference)):
    np.testing.assert_array_equal(x, y)
  assert jax.tree.structure(params) == jax.tree.structure(transformer.param_shapes(cfg))
  for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(transformer.param_shapes(cfg))):
    assert x.shape == s.shape and x.dtype == s.dtype
  base_logits = np.asarray(_logits(cfg.base, reference, tokens, mask))
  np.testing.assert_array_equal(np.asarray(_logits(cfg, params, tokens, mask)), base_logits)

  trained = lora.join_adapters(base, _random_adapters(adapters))
  adapted = np.asarray(_logits(cfg, trained, tokens, mask))
  merged = _np_merge(jax.tree.map(np.asarray, trained), ALPHA / RANK)
  want = np.asarray(_logits(cfg.base, merged, tokens, mask))
  assert np.abs(want - base_logits).max() > 0.05  # the adapters do change the model
  np.testing.assert_allclose(adapted, want, rtol=1e-4, atol=1e-4)
  ours = lora.merge_adapters(trained, cfg)
  for x, y in zip(jax.tree.leaves(ours), jax.tree.leaves(merged)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
  assert jax.tree.structure(ours) == jax.tree.structure(reference)


def _block(dispatch, rank):
  return moe.MoE(hidden_size=16, moe_intermediate_size=8, num_experts=4, experts_per_token=2,
                 norm_topk_prob=True, param_dtype="float32", dtype="float32",
                 rngs=nnx.Rngs(0), dispatch=dispatch, capacity_factor=1.0, lora_rank=rank,
                 lora_alpha=ALPHA, lora_targets=lora.TARGETS)


@pytest.mark.parametrize("dispatch", moe.DISPATCHES)
def test_expert_adapters_in_every_dispatch(dispatch):
  """Expert kernels [E, in, out] with per-expert factors [E, in, r], [E, r, out]: the adapted
  block equals the plain block on merged kernels (capacity 1.0 drops pairs: the same ones, the
  router has no adapter)."""
  graphdef, state = nnx.split(_block(dispatch, RANK))
  params = nnx.to_pure_dict(state)
  assert params["gate_proj_lora_a"].shape == (4, 16, RANK)
  assert params["down_proj_lora_b"].shape == (4, RANK, 16)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: jnp.asarray(0.3 * rng.normal(size=x.shape), x.dtype), params)
  nnx.replace_by_pure_dict(state, params)
  x = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
  y, stats = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, x)
  plain_graph, plain_state = nnx.split(_block(dispatch, 0))
  nnx.replace_by_pure_dict(plain_state, _np_merge(jax.tree.map(np.asarray, params), ALPHA / RANK))
  want, want_stats = jax.jit(lambda s, x: nnx.merge(plain_graph, s)(x))(plain_state, x)
  np.testing.assert_array_equal(stats.routes, want_stats.routes)
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_layout_init_and_targets():
  cfg = _cfg("qwen3_moe", lora_targets=("q_proj", "down_proj"))
  params = transformer.init_params(cfg)
  axes = transformer.logical_axes(cfg)
  attn, dense_mlp, experts = (params["layers_1"]["self_attn"], params["layers_0"]["mlp"],
                              params["layers_1"]["mlp"])
  # Only the named projections, in the dense MLP and the experts alike (PEFT's suffix match).
  assert set(attn["q_proj"]) == {"kernel", "lora_a", "lora_b"} and "lora_a" not in attn["k_proj"]
  assert "lora_a" in dense_mlp["down_proj"] and "lora_a" not in dense_mlp["gate_proj"]
  assert "down_proj_lora_a" in experts and "gate_proj_lora_a" not in experts
  # A shares its kernel's input axis, B its output axis; the rank axis is replicated.
  assert axes["layers_1"]["self_attn"]["q_proj"]["lora_a"] == ("embed", "lora_rank")
  assert axes["layers_1"]["self_attn"]["q_proj"]["lora_b"] == ("lora_rank", "q_heads")
  assert axes["layers_1"]["mlp"]["down_proj_lora_a"] == ("experts", "mlp", "lora_rank")
  assert axes["layers_1"]["mlp"]["down_proj_lora_b"] == ("experts", "lora_rank", "embed")
  # PEFT's init: A ~ U(-1/sqrt(in), 1/sqrt(in)) (std bound/sqrt(3)), B = 0.
  a = np.asarray(attn["q_proj"]["lora_a"])
  bound = 1 / np.sqrt(a.shape[0])
  assert np.abs(a).max() <= bound and abs(a.std() - bound / np.sqrt(3)) < 0.15 * bound
  assert not np.asarray(attn["q_proj"]["lora_b"]).any()
  assert not np.asarray(experts["down_proj_lora_b"]).any()
  # rank 0: today's tree, no adapter anywhere.
  assert not lora.has_adapters(transformer.init_params(cfg.replace(lora_rank=0)))


def test_split_join_and_foreign_adapters():
  cfg = _cfg("llama", lora_targets=("v_proj",))
  params = transformer.init_params(cfg)
  base, adapters = lora.split_adapters(params)
  assert set(adapters["layers_0"]["self_attn"]) == {"v_proj"}
  assert jax.tree.structure(lora.join_adapters(base, adapters)) == jax.tree.structure(params)
  lora.check_adapters(cfg, adapters, base, "adapters")
  other = lora.split_adapters(transformer.init_params(cfg.replace(lora_rank=2)))[1]
  with pytest.raises(ValueError, match=r"another base.*lora_a is \(64, 2\), the base needs "
                                       r"\(64, 4\)"):
    lora.check_adapters(cfg, other, base, "adapters")


def test_bad_lora_config_is_one_line():
  with pytest.raises(ConfigError, match=r"model.lora.targets names \['qkv'\].*q_proj"):
    _cfg("llama", lora_targets=("qkv",))
  with pytest.raises(ConfigError, match="model.lora.rank=-1"):
    _cfg("llama", lora_rank=-1)
  assert _cfg("llama", lora_targets="all").lora_targets == lora.TARGETS

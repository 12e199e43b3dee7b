"""The registered JAX engines (``rljax.rollout.engines``): each is the sampler it names, its
weights are the ones loaded last, a key only the other engine reads is refused by name, and with
``rollout.weight_dtype`` the engine samples with the per-channel FP8 round trip of the learner's
weights (``rljax.models.quantize``) while the learner's stay as they are."""
import dataclasses

import jax
import numpy as np
import pytest

import rljax
from rljax.config.checks import check_config
from rljax.errors import UnknownNameError, UnusedKeyError
from rljax.models import ModelConfig, quantize, transformer
from rljax.rollout import SamplingParams, left_pad, sample
from rljax.rollout.engines import (DRAFT_KEYS, ROLLOUT_ENGINES, EngineBase, JaxEngine, Placement,
                                   WeightSync)

CFG = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16, max_position_embeddings=64)
SP = SamplingParams(temperature=1.0, max_new_tokens=6, stop_ids=(3,), pad_id=0)
TOKENS, MASK = left_pad([[1, 5, 7], [2, 9], [4, 4, 8, 6]], 4, 0)


def _engine(name, **overrides):
  config = rljax.config(overrides={"rollout.engine": name, **overrides})
  return ROLLOUT_ENGINES.get(name)(config, CFG, Placement())


def _fields(r):
  return {k: np.asarray(getattr(r, k)) for k in ("tokens", "mask", "sampler_logp", "lengths")}


@pytest.mark.parametrize("name, budget", [("all_rows", 0), ("continuous", 5)])
def test_an_engine_is_the_sampler_it_names_with_the_weights_loaded_last(name, budget):
  engine = _engine(name, **({"rollout.max_concurrent_rows": budget} if budget else {}))
  assert isinstance(engine, JaxEngine) and engine.max_concurrent_rows == budget
  first, second = (transformer.init_params(CFG, seed=s) for s in (0, 1))
  key = jax.random.key(0)
  engine.load_weights(first, 0)
  engine.load_weights(second, 1)
  got = _fields(engine.generate(TOKENS, MASK, key, SP, 4))
  want = _fields(sample(CFG, second, TOKENS, MASK, key, SP, 4, max_concurrent_rows=budget))
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  other = _fields(sample(CFG, first, TOKENS, MASK, key, SP, 4))
  assert not np.array_equal(got["sampler_logp"], other["sampler_logp"])  # not the first weights
  assert engine.version == 1


def test_slot_budgets_are_continuous_only():
  """The continuous engine's registration declares the keys it reads; the key check refuses
  them with another engine, naming the engine that reads them."""
  assert ROLLOUT_ENGINES.meta("continuous")["reads"] == ("rollout.max_concurrent_rows",
                                                         "rollout.kv_cache_bytes", *DRAFT_KEYS)
  for key in ("rollout.max_concurrent_rows", "rollout.kv_cache_bytes"):
    with pytest.raises(UnusedKeyError, match=rf"^{key}=8 is not used: rollout.engine='all_rows' "
                                             r"does not read it; it is read by rollout engine "
                                             r"'continuous'$"):
      check_config(rljax.config(overrides={"rollout.engine": "all_rows", key: 8}))
    check_config(rljax.config(overrides={"rollout.engine": "continuous", key: 8}))


def test_an_unknown_engine_lists_the_registered_ones():
  with pytest.raises(UnknownNameError, match="registered: all_rows, continuous"):
    ROLLOUT_ENGINES.get("vllm")


def test_engine_base_holds_what_it_is_given():
  engine = EngineBase(CFG)
  weights = {"w": np.ones(2)}
  assert engine.transfer(weights) == (weights, {}) and engine.version == -1
  engine.load_weights(weights, 7)
  assert engine.weights is weights and engine.version == 7
  engine.close()
  assert engine.weights is None


FP8 = {"rollout.weight_dtype": "float8_e4m3fn"}


def test_fp8_weights_are_the_round_trip_and_the_learner_keeps_its_own():
  engine = _engine("all_rows", **FP8)
  params = transformer.init_params(CFG, seed=0)
  before = jax.tree.map(np.array, params)
  weights, _ = engine.transfer(params)
  engine.load_weights(weights, 0)
  by_hand = quantize.round_trip_weights(params)  # eager, not the engine's jitted program
  for got, want in zip(jax.tree.leaves(weights), jax.tree.leaves(by_hand)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  key = jax.random.key(0)
  greedy = dataclasses.replace(SP, greedy=True)
  for sp in (greedy, SP):
    got = _fields(engine.generate(TOKENS, MASK, key, sp, 4))
    want = _fields(sample(CFG, by_hand, TOKENS, MASK, key, sp, 4))
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  full = _fields(sample(CFG, params, TOKENS, MASK, key, SP, 4))
  assert not np.allclose(got["sampler_logp"], full["sampler_logp"])  # not the learner's weights
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(before)):
    np.testing.assert_array_equal(np.asarray(got), want)  # bit for bit


def test_fp8_sync_copies_for_an_asynchronous_sampler():
  # The learner's next update donates its buffers: the round trip's untouched leaves (the
  # embedding, norms) must be copies too, not the learner's own buffers.
  params = transformer.init_params(CFG, seed=0)
  placed, metrics = WeightSync(copy=True, weight_dtype="float8_e4m3fn")(params)
  flat = jax.tree_util.tree_leaves_with_path(placed)
  for (path, got), want in zip(flat, jax.tree.leaves(params)):
    assert got.unsafe_buffer_pointer() != want.unsafe_buffer_pointer(), path
    assert np.array_equal(np.asarray(got), np.asarray(want)) != quantize.quantized(path, got)
  assert metrics["weights/sync_bytes"] > 0


def test_fp8_sync_to_the_samplers_own_devices_places_the_round_trip():
  # mesh.sampler_devices: quantised, then put on the sampler's shardings (here one device).
  params = transformer.init_params(CFG, seed=0)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[-1])
  placed, _ = WeightSync(jax.tree.map(lambda _: device, params), weight_dtype="float8_e4m3fn")(
      params)
  for got, want in zip(jax.tree.leaves(placed), jax.tree.leaves(
      quantize.round_trip_weights(params))):
    assert got.sharding == device
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_an_unknown_weight_dtype_is_refused():
  with pytest.raises(ValueError, match="rollout.weight_dtype='int4'"):
    WeightSync(weight_dtype="int4")

"""The train_step's loss and updated parameters do not depend on the micro-batch split.

Of the padded rows (``model.pack=False``: 'auto' would pack the split minibatches on CPU); the
packed split's invariance is tests/train/test_packed_step.py's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import loader as config_loader
from rljax.models import tiny_config
from rljax.models import transformer
from rljax.algorithm import resolve
from rljax.train import build
from rljax.learner import step as step_lib, update as update_lib
from tests.train import tiny

import os

B, PW, T, VOCAB = 8, 8, 8, 40


def _rollout_arrays(seed=0):
  rewards = np.random.default_rng(seed + 1).integers(0, 2, B)
  return tiny.synthetic_rollout(B, PW, T, VOCAB, rewards, seed)


def _config(loss_agg, micro):
  overrides = dict(tiny.OVERRIDES)
  overrides.update({"algo.loss_agg": loss_agg, "algo.micro_batches": str(micro),
                    "algo.minibatches": "2", "algo.epochs": "2", "rollout.group_size": "4",
                    "algo.kl_placement": "loss", "algo.entropy_coef": "0.01",
                    "algo.pos_lm_coef": "0.1", "model.pack": "False"})
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                   list(overrides.items()))


def _one_step(loss_agg, micro):
  config = _config(loss_agg, micro)
  model_cfg = tiny_config(config.model, VOCAB)
  params = transformer.init_params(model_cfg, seed=0)
  fns, state, hp = _step_fns(config, model_cfg, params)
  batch, _ = jax.jit(fns.score)(state, _rollout_arrays(), hp)
  # Perturb old log-probs so ratios differ from 1 and clipping is exercised.
  batch = batch.replace(old_logp=batch.old_logp + 0.3 * jnp.sin(jnp.arange(T))[None])
  new_state, metrics = jax.jit(fns.train_step)(state, batch, hp)
  return new_state, metrics


def _step_fns(config, model_cfg, params):
  """(unjitted StepFns, initial state, hparams) of a config, on one device."""
  algo = resolve(config)
  _, make = build.abstract_state(config, model_cfg, algo)
  return step_lib.step_fns(build.step_spec(config, model_cfg, algo)), make(params), algo.hparams


@pytest.mark.slow
# The two normalisers a micro-batch split could get wrong: the batch's token count (token_mean)
# and its sequence count (seq_mean_*; seq_mean_token_sum shares it, *_norm divides by a constant).
# Each aggregation's formula is checked against NumPy in tests/algos.
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batches_leave_loss_and_params_unchanged(loss_agg):
  ref_state, ref_metrics = _one_step(loss_agg, 1)
  for micro in (4,):  # 2 parts add nothing that 4 do not test (and each split compiles anew)
    state, metrics = _one_step(loss_agg, micro)
    np.testing.assert_allclose(float(metrics["loss"][0]), float(ref_metrics["loss"][0]),
                               rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  # The update really moved the parameters (so the comparison above is not vacuous).
  initial = transformer.init_params(tiny_config(_config(loss_agg, 1).model, VOCAB), seed=0)
  moved = max(float(jnp.abs(a - b).max()) for a, b in
              zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(initial)))
  assert moved > 1e-4


def _on_policy_step(micro, **extra):
  """One GRPO step with one optimizer update per batch: (state, prepare metrics, step metrics)."""
  overrides = dict(tiny.OVERRIDES)
  overrides.update({"algo.micro_batches": str(micro), "algo.minibatches": "1",
                    "algo.epochs": "1", "rollout.group_size": "4", "algo.kl_placement": "loss",
                    "algo.entropy_coef": "0.01", "model.pack": "False"}, **extra)
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                     list(overrides.items()))
  model_cfg = tiny_config(config.model, VOCAB)
  fns, state, hp = _step_fns(config, model_cfg, transformer.init_params(model_cfg, seed=0))
  # A reference away from the policy, so that the KL term and its metric are not zero.
  state = state.replace(ref_params=jax.tree.map(lambda p: p * 1.1, state.ref_params))
  batch, scored = jax.jit(fns.score)(state, _rollout_arrays(3), hp)
  new_state, metrics = jax.jit(fns.train_step)(state, batch, hp)
  return new_state, scored, metrics


@pytest.mark.slow
def test_one_update_per_batch_reuses_the_policy_forward():
  """With one update per batch the loss takes the old log-probs from its own forward (scoring
  skips the policy, old_logp stays None), whatever the micro-batch split: same update and same
  metrics as scoring first. Scoring first is forced by the overlong filter, a no-op on these
  untruncated rows; the reused forward's scoring metrics (a max, row means) are computed over
  the whole batch, so 4 micro-batches give the batch's values, not a mean of 4 parts'."""
  scoring_first = _on_policy_step(1, **{"algo.overlong_filter": "True"})
  state, scored, metrics = scoring_first
  assert "entropy" in scored
  merged = {**scored, **metrics}
  for micro in (1, 4):
    reused_state, reused_scored, reused = _on_policy_step(micro)
    assert "entropy" not in reused_scored  # the forward was skipped
    merged_reused = {**reused_scored, **reused}
    assert set(merged_reused) == set(merged)
    for name in ("entropy", "logp_gap_mean", "logp_gap_max", "kl", "loss", "kl_loss",
                 "mismatch/k1", "mismatch/chi2_seq", "mismatch/abs_diff_max"):
      value = lambda m: float(m[name][0]) / float(m[name][1])
      np.testing.assert_allclose(value(merged_reused), value(merged), rtol=1e-5, atol=1e-6,
                                 err_msg=f"{name}, micro_batches={micro}")
    for a, b in zip(jax.tree.leaves(reused_state.params), jax.tree.leaves(state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert float(merged["kl"][0]) > 0 and float(merged["entropy"][0]) > 0


@pytest.mark.slow
def test_a_hyperparameter_sweep_reuses_one_compilation():
  """Float hyperparameters are traced arguments: two clip widths, one compiled train_step, two
  different updates."""
  config = _config("token_mean", 1)
  model_cfg = tiny_config(config.model, VOCAB)
  fns, state, hp = _step_fns(config, model_cfg, transformer.init_params(model_cfg, seed=0))
  batch, _ = jax.jit(fns.score)(state, _rollout_arrays(), hp)
  batch = batch.replace(old_logp=batch.old_logp + 0.3 * jnp.sin(jnp.arange(T))[None])
  train = jax.jit(fns.train_step)
  wide = train(state, batch, dict(hp, clip_eps_high=0.5, clip_eps_low=0.5))[1]
  narrow = train(state, batch, dict(hp, clip_eps_high=0.01, clip_eps_low=0.01))[1]
  assert train._cache_size() == 1
  frac = lambda m: float(m["clip_frac_high"][0] + m["clip_frac_low"][0])
  assert frac(narrow) > frac(wide)


def test_row_parts_hand_worked():
  """64 rows of 136 tokens, 1024 per chunk: 9 wanted, 16 the next divisor of 64 (4 rows each);
  over 8 shards a shard holds 8 rows: 2 parts (4 x 136 = 544 tokens a part); a row longer than
  the limit goes alone; no limit, or rows that do not divide, keep the micro-batches."""
  row_parts = update_lib.row_parts
  assert row_parts(64, 1, 136, 1024) == 16
  assert row_parts(64, 8, 136, 1024) == 2
  assert row_parts(64, 1, 264, 1024) == 32
  assert row_parts(64, 1, 4096, 1024) == 64
  assert row_parts(64, 1, 136, 1024, at_least=4) == 16
  assert row_parts(48, 1, 136, 1024, at_least=2) == 8  # 2 x 4 parts of 6 rows (816 tokens)
  assert row_parts(64, 1, 136, 0, at_least=2) == 2
  assert row_parts(64, 1, 136, 1 << 20) == 1
  assert row_parts(60, 8, 136, 1024) == 1  # 60 rows do not shard evenly over 8


def test_forward_tokens_auto_is_per_cpu_thread_of_a_device(monkeypatch):
  """-1: 1024 tokens per core this process may use per local CPU device on CPU (1 core: 1024;
  2 cores and 1 device: 2048; 2 cores and 2 devices: 1024), no limit on accelerators, and as
  many chunks side by side as cores per device; a set value is kept."""
  from rljax.parallel import mesh as mesh_lib
  local = lambda n: monkeypatch.setattr(mesh_lib.jax, "local_devices",
                                        lambda backend=None: [None] * n)
  local(1)
  monkeypatch.setattr(mesh_lib.os, "sched_getaffinity", lambda pid: {0})
  assert update_lib.forward_tokens(-1, "cpu") == 1024
  monkeypatch.setattr(mesh_lib.os, "sched_getaffinity", lambda pid: {0, 1})
  assert update_lib.forward_tokens(-1, "cpu") == 2048
  assert update_lib.forward_tokens(-1, "gpu") == 0 and update_lib.forward_tokens(-1, "tpu") == 0
  assert update_lib.forward_tokens(512, "cpu") == 512 and update_lib.forward_tokens(0, "cpu") == 0
  # model.parallel_chunks: -1 = one chunk per CPU thread of a device side by side, one on
  # accelerators.
  assert update_lib.concurrent_chunks(-1, "cpu") == 2
  assert update_lib.concurrent_chunks(-1, "gpu") == 1
  assert update_lib.concurrent_chunks(3, "cpu") == 3
  local(2)  # mesh.cpu_devices: a device per core
  assert update_lib.forward_tokens(-1, "cpu") == 1024
  assert update_lib.concurrent_chunks(-1, "cpu") == 1


@pytest.mark.slow
def test_forward_tokens_chunk_the_rows_without_changing_the_step():
  """``model.forward_tokens=16``: every forward of scoring (policy, reference) and the update run
  one 16-token row at a time (8 chunks); the scored log-probs, the metrics and the updated
  parameters equal the unchunked step's."""
  runs = [_on_policy_step(1, **{"algo.overlong_filter": "True", "model.forward_tokens": str(n)})
          for n in (0, 16)]
  (state0, scored0, metrics0), (state1, scored1, metrics1) = runs
  for name in set(scored0) | set(metrics0):
    a, b = {**scored0, **metrics0}[name], {**scored1, **metrics1}[name]
    np.testing.assert_allclose(float(a[0]) / float(a[1]), float(b[0]) / float(b[1]), rtol=1e-5,
                               atol=1e-6, err_msg=name)
  for a, b in zip(jax.tree.leaves(state0.params), jax.tree.leaves(state1.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("side_by_side", [1, 2, 3])
def test_chunks_side_by_side_keep_the_sums(side_by_side):
  """A least-squares loss over 12 rows in 4 micro-batches, 1-3 of them per scan iteration (3
  leaves a remainder): the summed gradient equals NumPy's over the whole batch, X^T (X w - y) / n,
  and ``map_rows`` returns the rows in order."""
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(12, 3)).astype(np.float32), rng.normal(size=12).astype(np.float32)
  w = rng.normal(size=3).astype(np.float32)

  def loss_fn(w, micro, counts):
    err = micro["x"] @ w - micro["y"]
    return 0.5 * jnp.sum(err ** 2) / counts["n"], {"sq": (jnp.sum(err ** 2), counts["n"])}

  loss, grads, metrics = jax.jit(lambda w: update_lib.accumulate_gradients(
      loss_fn, w, {"x": x, "y": y}, {"n": 12.0}, parts=4, side_by_side=side_by_side))(w)
  err = x.astype(np.float64) @ w - y
  np.testing.assert_allclose(np.asarray(grads), x.T.astype(np.float64) @ err / 12, rtol=1e-5)
  np.testing.assert_allclose(float(loss), 0.5 * np.sum(err ** 2) / 12, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["sq"][0]), np.sum(err ** 2), rtol=1e-5)
  rows = update_lib.map_rows(lambda t: t["x"] @ w, {"x": x}, update_lib.RowSplit(4, side_by_side))
  np.testing.assert_allclose(np.asarray(rows), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-6)

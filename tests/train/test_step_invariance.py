"""The train_step's loss and updated parameters do not depend on the micro-batch split."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import config_loader
from rljax.models import tiny_config
from rljax.models import llama
from rljax.algos import resolve
from rljax.train import build, step as step_lib
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
                    "algo.pos_lm_coef": "0.1"})
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "grpo.py"),
                                   list(overrides.items()))


def _one_step(loss_agg, micro):
  config = _config(loss_agg, micro)
  model_cfg = tiny_config(config.model, VOCAB)
  params = llama.init_params(model_cfg, seed=0)
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
  return step_lib.step_fns(build.learner(config, model_cfg, algo)), make(params), algo.hparams


@pytest.mark.slow
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                                      "seq_mean_token_sum_norm"])
def test_micro_batches_leave_loss_and_params_unchanged(loss_agg):
  ref_state, ref_metrics = _one_step(loss_agg, 1)
  for micro in (2, 4):
    state, metrics = _one_step(loss_agg, micro)
    np.testing.assert_allclose(float(metrics["loss"][0]), float(ref_metrics["loss"][0]),
                               rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  # The update really moved the parameters (so the comparison above is not vacuous).
  initial = llama.init_params(tiny_config(_config(loss_agg, 1).model, VOCAB), seed=0)
  moved = max(float(jnp.abs(a - b).max()) for a, b in
              zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(initial)))
  assert moved > 1e-4


def _on_policy_step(micro, **extra):
  """One GRPO step with one optimizer update per batch: (state, prepare metrics, step metrics)."""
  overrides = dict(tiny.OVERRIDES)
  overrides.update({"algo.micro_batches": str(micro), "algo.minibatches": "1",
                    "algo.epochs": "1", "rollout.group_size": "4", "algo.kl_placement": "loss",
                    "algo.entropy_coef": "0.01"}, **extra)
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "grpo.py"),
                                     list(overrides.items()))
  model_cfg = tiny_config(config.model, VOCAB)
  fns, state, hp = _step_fns(config, model_cfg, llama.init_params(model_cfg, seed=0))
  # A reference away from the policy, so that the KL term and its metric are not zero.
  state = state.replace(ref_params=jax.tree.map(lambda p: p * 1.1, state.ref_params))
  batch, scored = jax.jit(fns.score)(state, _rollout_arrays(3), hp)
  new_state, metrics = jax.jit(fns.train_step)(state, batch, hp)
  return new_state, scored, metrics


@pytest.mark.slow
def test_one_update_per_batch_reuses_the_policy_forward():
  """With one update per batch the loss takes the old log-probs from its own forward (scoring
  skips the policy, old_logp stays None): same update and same metrics as scoring first
  (micro_batches=2 does)."""
  reused_state, reused_scored, reused = _on_policy_step(1)
  state, scored, metrics = _on_policy_step(2)
  assert "entropy" not in reused_scored and "entropy" in scored  # the forward was skipped
  merged_reused, merged = {**reused_scored, **reused}, {**scored, **metrics}
  assert set(merged_reused) == set(merged)
  for name in ("entropy", "logp_gap_mean", "logp_gap_max", "kl", "loss", "kl_loss",
               "mismatch/k1", "mismatch/chi2_seq"):
    value = lambda m: float(m[name][0]) / float(m[name][1])
    np.testing.assert_allclose(value(merged_reused), value(merged), rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert float(merged["kl"][0]) > 0 and float(merged["entropy"][0]) > 0
  for a, b in zip(jax.tree.leaves(reused_state.params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_hyperparameter_sweep_reuses_one_compilation():
  """Float hyperparameters are traced arguments: two clip widths, one compiled train_step, two
  different updates."""
  config = _config("token_mean", 1)
  model_cfg = tiny_config(config.model, VOCAB)
  fns, state, hp = _step_fns(config, model_cfg, llama.init_params(model_cfg, seed=0))
  batch, _ = jax.jit(fns.score)(state, _rollout_arrays(), hp)
  batch = batch.replace(old_logp=batch.old_logp + 0.3 * jnp.sin(jnp.arange(T))[None])
  train = jax.jit(fns.train_step)
  wide = train(state, batch, dict(hp, clip_eps_high=0.5, clip_eps_low=0.5))[1]
  narrow = train(state, batch, dict(hp, clip_eps_high=0.01, clip_eps_low=0.01))[1]
  assert train._cache_size() == 1
  frac = lambda m: float(m["clip_frac_high"][0] + m["clip_frac_low"][0])
  assert frac(narrow) > frac(wide)

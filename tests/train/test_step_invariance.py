"""The train_step's loss and updated parameters do not depend on the micro-batch split."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import config_loader
from rljax.models import tiny_config
from rljax.models import llama
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
  _, make = build.abstract_state(config, model_cfg)
  state = make(params)
  actor_tx, critic_tx = build.optimizers(config)
  fns = step_lib.build_step_fns(config, model_cfg, actor_tx, critic_tx)
  batch, _ = jax.jit(fns.prepare_batch)(state, *_rollout_arrays())
  # Perturb old log-probs so ratios differ from 1 and clipping is exercised.
  batch = batch.replace(old_logp=batch.old_logp + 0.3 * jnp.sin(jnp.arange(T))[None])
  new_state, metrics = jax.jit(fns.train_step)(state, batch)
  return new_state, metrics


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

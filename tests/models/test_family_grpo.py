"""A GRPO step (scoring and one update) runs on Gemma 3 (sandwich norms, GeGLU, scaled
embeddings), the one block the other runs do not cover: Llama runs the presets
(tests/train/test_presets.py), Qwen3-MoE a whole GRPO run with Qwen3's q/k-norm attention
(tests/train/test_moe_train.py); Mistral's and Gemma's windows are the attention of the forward,
checked against transformers."""
import os

import jax
import numpy as np
import pytest

from rljax.config import loader as config_loader
from rljax import models
from rljax.algorithm import resolve
from rljax.train import build
from rljax.learner import step as step_lib
from tests.train import tiny

VOCAB, B, PW, T = 57, 8, 6, 8


@pytest.mark.parametrize("family", ["gemma3_text"])
def test_grpo_step_updates_the_policy(family):
  config = config_loader.load_config(
      os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
      list(dict(tiny.OVERRIDES, **{"model.family": family}).items()))
  model_cfg = models.tiny_config(config.model, VOCAB)
  params = models.init_params(model_cfg, seed=0)
  algo = resolve(config)
  _, make = build.abstract_state(config, model_cfg, algo)
  fns, state = step_lib.step_fns(build.step_spec(config, model_cfg, algo)), make(params)
  rewards = np.random.default_rng(1).integers(0, 2, B)
  rollout = tiny.synthetic_rollout(B, PW, T, VOCAB, rewards)
  batch, _ = jax.jit(fns.score)(state, rollout, algo.hparams)
  new_state, metrics = jax.jit(fns.train_step)(state, batch, algo.hparams)
  assert np.isfinite(float(metrics["loss"][0]))
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(params)))
  assert moved > 1e-5

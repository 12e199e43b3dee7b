"""Packed forwards (``model.pack``) leave scoring and the update as they are padded.

Packing changes only where the forwards' tokens sit; their per-token outputs come back to the
padded ``[B, T]`` layout and the losses run there unchanged. So the packed step equals the padded
one if (1) the per-token outputs and their gradients are the padded forward's (attention within
segments, positions restarting per segment: the test with a real layer below, multi-turn rows
included) and (2) every preset's losses, counts and transforms give the same sums when a
micro-batch is a packed chunk (the whole minibatch with the loss mask kept on the chunk's rows)
instead of a slice of rows. (2) does not depend on the attention, so every preset is checked on
a model without layers (embedding, final norm, head: a real ``Transformer``, each token's outputs
its own), where a step costs a fraction of a second run op by op (``jax.disable_jit``: no program
is compiled per preset).

Tolerance: the two sides sum the same float32 terms (at most B x T = 64 per sum, |term| < ~10)
in another order, 64 x 2^-24 ~ 4e-6 relative; rtol 1e-5, atol 1e-6 as the micro-batch invariance
tests. AdamW's epsilon is 1 here, so its first step is ``lr g / (|g| + 1) ~ lr g``: the updated
parameters compare the gradients coordinate by coordinate (with the usual 1e-8 the step is
``lr sign(g)``, and a coordinate whose gradient is rounding noise could flip).
"""
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import loader as config_loader
from rljax.algorithm import resolve
from rljax.models import transformer, tiny_config
from rljax.train import build
from rljax.learner import step as step_lib
from tests.train import tiny
from tests.train.test_presets import PRESETS

B, PW, T, VOCAB = 8, 8, 8, 40
# Packed: 4 rows of 16 tokens a chunk, 2 chunks (the synthetic rows hold 2-16 tokens), so a
# micro-batch is a chunk of some rows; scoring the same. Padded: all rows at once (one
# micro-batch; the split's invariance is tests/train/test_step_invariance.py's).
FORWARD_TOKENS = 64


def _config(preset, pack, **extra):
  overrides = dict(tiny.overrides(preset), **{
      "model.pack": str(pack), "model.forward_tokens": str(FORWARD_TOKENS if pack else 0),
      "optim.lr": "1e-2", "optim.eps": "1.0"})
  overrides.update({k: str(v) for k, v in extra.items()})
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", f"{preset}.py"),
                                   list(overrides.items()))


def _rollout(seed=0):
  rng = np.random.default_rng(seed + 1)
  rollout = tiny.synthetic_rollout(B, PW, T, VOCAB, rng.integers(0, 2, B), seed)
  # Sampler log-probs near a model's (so the rollout-correction ratios stay in range).
  return rollout.replace(sampler_logp=(-np.log(VOCAB) + 0.1 * rng.normal(size=(B, T))
                                       ).astype(np.float32) * rollout.mask)


def _step(config, model_cfg, rollout, jit: bool):
  """(scored rollout, scoring metrics, state after one train_step, its metrics)."""
  algo = resolve(config)
  aux_cfgs, aux = (), ()
  if algo.transform("opd") is not None:  # the distillation teacher: another random model
    aux_cfgs, aux = (("opd", model_cfg),), ({"opd": transformer.init_params(model_cfg, seed=1)},)
  _, make = build.abstract_state(config, model_cfg, algo)
  fns = step_lib.step_fns(build.step_spec(config, model_cfg, algo, aux_cfgs))
  state = make(transformer.init_params(model_cfg, seed=0))
  if state.ref_params is not None:  # a reference away from the policy: KL terms are not zero
    state = state.replace(ref_params=jax.tree.map(lambda p: p * 1.1, state.ref_params))
  score, train = (jax.jit(fns.score), jax.jit(fns.train_step)) if jit else \
      (fns.score, fns.train_step)
  scored, scoring = score(state, rollout, algo.hparams, *aux)
  if scored.old_logp is not None:  # ratios away from 1, so that clipping is exercised
    scored = scored.replace(old_logp=scored.old_logp + 0.3 * jnp.sin(jnp.arange(T))[None])
  new_state, metrics = train(state, scored, algo.hparams)
  return scored, scoring, new_state, metrics


def assert_same_step(padded, packed, what):
  (scored0, scoring0, state0, metrics0), (scored1, scoring1, state1, metrics1) = padded, packed
  merged0, merged1 = {**scoring0, **metrics0}, {**scoring1, **metrics1}
  assert set(merged1) - set(merged0) <= {"pack/fill", "pack/update_fill"}, what
  for name, (total, count) in merged0.items():
    np.testing.assert_allclose(float(merged1[name][1]), float(count), rtol=1e-6,
                               err_msg=f"{what}: {name} count")
    np.testing.assert_allclose(float(merged1[name][0]) / max(float(count), 1e-30),
                               float(total) / max(float(count), 1e-30), rtol=1e-5, atol=1e-6,
                               err_msg=f"{what}: {name}")
  mask = np.asarray(scored0.mask, np.float32)
  for field in ("old_logp", "ref_logp", "values", "returns", "advantages"):
    a, b = getattr(scored0, field), getattr(scored1, field)
    assert (a is None) == (b is None), field
    if a is not None:
      np.testing.assert_allclose(np.asarray(b) * mask, np.asarray(a) * mask, rtol=1e-5,
                                 atol=1e-6, err_msg=f"{what}: {field}")
  for a, b in zip(jax.tree.leaves((state0.params, state0.critic_params)),
                  jax.tree.leaves((state1.params, state1.critic_params))):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6,
                               err_msg=f"{what}: parameters")


def _layerless(config):
  return dataclasses.replace(tiny_config(config.model, VOCAB), num_layers=0)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_packed_equals_padded(preset):
  """Loss, every metric, the scored fields, the gradient (its norm, and through AdamW every
  updated parameter) of one step of each preset: packed = padded."""
  rollout = _rollout()
  if preset == "remax":  # the greedy baseline's rewards, which the loop adds before scoring
    rollout = rollout.replace(extras={"remax_baseline": np.linspace(0, 1, B, dtype=np.float32)})
  configs = [_config(preset, pack) for pack in (False, True)]
  model_cfg = _layerless(configs[0])
  with jax.disable_jit():
    runs = [_step(config, model_cfg, rollout, jit=False) for config in configs]
  assert_same_step(*runs, preset)
  # The update's minibatch was packed into 2 chunks of 4 x 16 slots (fill = tokens / slots).
  tokens = int(rollout.prompt_mask.sum() + rollout.mask.sum())
  fill = runs[1][3]["pack/update_fill"]
  assert round(tokens / (float(fill[0]) / float(fill[1]) * 4 * 16)) == 2
  moved = max(float(jnp.abs(a - b).max()) for a, b in
              zip(jax.tree.leaves(runs[1][2].params),
                  jax.tree.leaves(transformer.init_params(model_cfg, seed=0))))
  assert moved > 1e-4  # the step changed the parameters: the comparison is not vacuous


def test_token_budget_chunks_leave_the_step_unchanged():
  """``model.forward_tokens`` sets the packed chunk: one 16-token row a chunk (up to 4 chunks of
  a minibatch's 4 sequences), or the whole minibatch in one (0: no limit); two minibatches, each
  laid out anew from its own rows; KL and entropy terms. Every split gives the padded step."""
  extra = {"algo.minibatches": 2, "algo.kl_placement": "loss", "algo.entropy_coef": 0.01}
  rollout = _rollout(1)
  with jax.disable_jit():
    padded = _step(_config("grpo", False, **extra), _layerless(_config("grpo", False)), rollout,
                   jit=False)
    for budget in (16, 0):
      config = _config("grpo", True, **extra, **{"model.forward_tokens": budget})
      assert_same_step(padded, _step(config, _layerless(config), rollout, jit=False),
                       f"forward_tokens={budget}")


def test_auto_packs_scoring_in_two_chunks_and_leaves_the_one_chunk_update_padded():
  """``model.pack='auto'`` (the default) with chunks of 64 / 16 = 4 rows: scoring's 8 rows take
  2 chunks (packed, ``pack/fill`` logged), each minibatch's 4 rows 1 chunk (padded, no
  ``pack/update_fill``); the step is the padded one's."""
  extra = {"algo.minibatches": 2}
  rollout = _rollout(3)
  config = _config("grpo", "auto", **extra)
  with jax.disable_jit():
    padded = _step(_config("grpo", False, **extra), _layerless(config), rollout, jit=False)
    auto = _step(config, _layerless(config), rollout, jit=False)
  assert "pack/fill" in auto[1] and "pack/update_fill" not in auto[3]
  assert_same_step(padded, auto, "model.pack=auto")


def _multi_turn(rollout):
  """The rollout as multi-turn records: in each completion of 5+ tokens, tokens 2-3 are an
  environment's observation (``extras['source']`` 2): attended to, outside the loss mask."""
  mask = np.asarray(rollout.mask)
  source = mask.copy()
  long = mask.sum(1) >= 5
  source[long, 2:4] = 2
  assert long.sum() >= 2
  return rollout.replace(mask=(source == 1).astype(np.int32), extras={"source": source})


def test_packed_attention_step_equals_padded_on_multi_turn_records():
  """A real layer (attention within segments, positions restarting per segment, the model's
  default attention backend) on multi-turn records, PPO (KL in the reward: scoring runs the old,
  reference and critic forwards), GAE, the actor and critic updates: packed = padded (the padded
  forward attends to the observations, so the packed one does too)."""
  rollout = _multi_turn(_rollout(2))
  configs = [_config("ppo", pack) for pack in (False, True)]
  model_cfg = tiny_config(configs[0].model, VOCAB)
  assert model_cfg.num_layers == 1
  with jax.disable_jit():
    padded, packed = [_step(config, model_cfg, rollout, jit=False) for config in configs]
  assert_same_step(padded, packed, "ppo, multi-turn")


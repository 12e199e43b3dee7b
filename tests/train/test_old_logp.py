"""``algo.old_logp='sampler'``: the PPO ratio's old log-probs are the sampler's recorded ones, and
scoring runs no policy forward (``StepSpec.scoring_forward``).

One batch really sampled by the tiny policy (at temperature 1.5 and top-p 0.9: the sampler
records the temperature-1 log-prob of each token, the trainer's, whatever it sampled with), scored
and trained once with each setting: two updates (``algo.minibatches=2``), so that 'recompute'
scores with its own forward and the KL term keeps the reference forward in both."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import checks as config_checks, loader as config_loader
from rljax.algorithm import resolve
from rljax.errors import ConfigError
from rljax.models import transformer, tiny_config
from rljax.rollout import sampler as sampler_lib
from rljax.rollout.sampling import SamplingParams
from rljax.train import build
from rljax.learner import step as step_lib, update as update_lib
from tests.train import tiny

VOCAB, PROMPTS, GROUP, PW, T = 40, 2, 4, 8, 8
SCORING = {"algo.minibatches": "2", "model.pack": "False", "optim.lr": "1e-3"}


def _config(mode: str, **extra):
  overrides = dict(tiny.OVERRIDES, **SCORING, **{"algo.old_logp": mode}, **extra)
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                   list(overrides.items()))


def _sampled_rollout(model_cfg, params):
  """B = 8 rows sampled by the policy, with rewards that give every group a spread."""
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, VOCAB, (PROMPTS, PW)).astype(np.int32)
  prompt_mask = np.ones_like(prompts)
  prompt_mask[0, :3] = 0  # left padding
  sp = SamplingParams(temperature=1.5, top_p=0.9, max_new_tokens=T, stop_ids=(1,), pad_id=0)
  out = jax.device_get(sampler_lib.sample(model_cfg, params, prompts, prompt_mask,
                                          jax.random.PRNGKey(3), sp, GROUP))
  rewards = np.tile(np.array([1.0, 0.0, 0.0, 1.0], np.float32), PROMPTS)
  return out.replace(rewards=rewards, correct=rewards > 0, row_valid=np.ones_like(rewards))


@pytest.fixture(scope="module")
def steps():
  """Per setting: the scored batch, the metrics of score and train_step, the updated state, the
  policy forwards (``policy_stats`` calls) traced into ``score``; and the jitted functions."""
  model_cfg = tiny_config(_config("recompute").model, VOCAB)
  params = transformer.init_params(model_cfg, seed=0)
  rollout = _sampled_rollout(model_cfg, params)
  out = {"rollout": rollout, "model_cfg": model_cfg}
  calls = []
  real = step_lib.policy_stats
  counting = lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(step_lib, "policy_stats", counting)
    for mode in ("recompute", "sampler"):
      config = _config(mode)
      algo = resolve(config)
      spec = build.step_spec(config, model_cfg, algo)
      fns = step_lib.step_fns(spec)
      state = build.abstract_state(config, model_cfg, algo)[1](params)
      # A reference away from the policy, so that the KL metric is not zero.
      state = state.replace(ref_params=jax.tree.map(lambda p: p * 1.1, state.ref_params))
      score, train = jax.jit(fns.score), jax.jit(fns.train_step)
      calls.clear()
      scored, score_metrics = score(state, rollout, algo.hparams)
      forwards = len(calls)
      new_state, metrics = train(state, scored, algo.hparams)
      out[mode] = dict(scored=scored, metrics={**score_metrics, **metrics}, state=new_state,
                       forwards=forwards, spec=spec, score=score, train=train, initial=state,
                       hp=algo.hparams)
  return out


def test_sampler_old_logp_are_the_recorded_ones_and_scoring_skips_the_policy(steps):
  recompute, sampler = steps["recompute"], steps["sampler"]
  assert recompute["spec"].scoring_forward and not sampler["spec"].scoring_forward
  # 'recompute' traces the policy's and the reference's forward into score, 'sampler' only the
  # reference's (its log-probs are still there).
  assert (recompute["forwards"], sampler["forwards"]) == (2, 1)
  assert sampler["scored"].ref_logp is not None
  np.testing.assert_array_equal(np.asarray(sampler["scored"].old_logp),
                                steps["rollout"].sampler_logp)
  # The scoring metrics are all still logged (from the update's forwards) ...
  assert set(sampler["metrics"]) == set(recompute["metrics"])
  value = lambda m, k: float(m[k][0]) / float(m[k][1])
  # ... over the whole batch: the first minibatch's rows under the batch's own weights, the
  # second's after one update (Adam's first step moves each weight by at most about lr, 1e-3).
  # Measured: entropy 6e-6 and kl 5e-3 relative apart. (logp_gap and mismatch/ then include
  # the policy's change over the first update: 2e-3 against 6e-8.)
  for name in ("entropy", "kl", "mismatch/train_ppl"):
    a, b = value(sampler["metrics"], name), value(recompute["metrics"], name)
    assert abs(a - b) <= 5e-2 * abs(b), (name, a, b)


def _gap(steps) -> float:
  """max |sampler_logp - recomputed old_logp| over the valid tokens: float rounding only."""
  mask = steps["rollout"].mask > 0
  diff = np.abs(steps["rollout"].sampler_logp - np.asarray(steps["recompute"]["scored"].old_logp))
  return float(diff[mask].max())


def test_the_loss_takes_the_sampler_log_probs_as_the_old_ones(steps):
  """Fed the recomputed old log-probs as the sampler's, 'sampler' makes the update 'recompute'
  makes; fed the sampler's own, which differ by float rounding, nearly the same one."""
  recompute, sampler = steps["recompute"], steps["sampler"]
  leaves = lambda s: [np.asarray(x) for x in jax.tree.leaves(s.params)]
  same_input = steps["rollout"].replace(
      sampler_logp=np.asarray(recompute["scored"].old_logp))
  scored, _ = sampler["score"](sampler["initial"], same_input, sampler["hp"])
  state, _ = sampler["train"](sampler["initial"], scored, sampler["hp"])
  for a, b in zip(leaves(state), leaves(recompute["state"])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
  # The sampler's log-probs differ from the recomputed ones by float rounding, at most `gap`.
  # The scale of what such a difference does to the update: 'recompute' with its old log-probs
  # moved by +-gap (a fixed random sign per token).
  gap = _gap(steps)
  assert 0 < gap < 1e-4
  signs = np.random.default_rng(0).choice([-1.0, 1.0], recompute["scored"].old_logp.shape)
  nudged = recompute["scored"].replace(old_logp=recompute["scored"].old_logp + gap * signs)
  control, _ = recompute["train"](recompute["initial"], nudged, recompute["hp"])
  diff = lambda s, t: max(float(np.abs(a - b).max()) for a, b in zip(leaves(s), leaves(t)))
  scale = diff(control, recompute["state"])
  # Measured: gap 2.4e-7, scale 1.0e-7, the sampler's update 4.6e-8 from the recomputed one.
  assert 0 < scale < 1e-5
  assert diff(sampler["state"], recompute["state"]) <= 10 * scale
  assert diff(recompute["initial"], recompute["state"]) > 1e-3  # the update moved the weights


def test_a_transform_that_reads_old_logp_takes_the_samplers(steps):
  """Clip-Cov's per-minibatch selection reads ``old_logp`` (``needs_old_logp``): with 'sampler'
  scoring still runs no policy forward, and the step traces with the sampler's log-probs."""
  config = _config("sampler", **{"algo.policy_loss": "clip_cov"})
  algo = resolve(config)
  spec = build.step_spec(config, steps["model_cfg"], algo)
  assert algo.needs_old_logp and not spec.scoring_forward
  fns = step_lib.step_fns(spec)
  state = steps["sampler"]["initial"]
  scored, _ = jax.eval_shape(fns.score, state, steps["rollout"], algo.hparams)
  assert scored.old_logp.shape == steps["rollout"].sampler_logp.shape
  _, metrics = jax.eval_shape(fns.train_step, state, scored, algo.hparams)
  assert "entropy" in metrics  # the scoring metrics, from the update's forwards


def test_no_sampler_log_probs_is_refused(steps):
  sampler = steps["sampler"]
  with pytest.raises(ValueError, match="needs the sampler's log-probs"):
    jax.eval_shape(step_lib.step_fns(sampler["spec"]).score, sampler["initial"],
                   steps["rollout"].replace(sampler_logp=None), sampler["hp"])


@pytest.mark.parametrize("extra, says", [
    ({"algo.entropy_top_rho": "0.5"}, "algo.entropy_top_rho=0.5 masks by H_old"),
    ({"algo.tis_cap": "2.0"}, "algo.tis_cap=2.0: rollout correction"),
    ({"algo.rollout_rs": "token", "algo.rollout_rs_hi": "2.0"}, "algo.rollout_rs='token'"),
])
def test_combinations_that_need_the_scoring_forward_are_refused(extra, says):
  with pytest.raises(ConfigError, match=says):
    config_checks.check_config(_config("sampler", **extra))
  config_checks.check_config(_config("recompute", **extra))


def test_any_temperature_and_truncation_are_allowed():
  """The sampler records each token's temperature-1 log-prob, whatever it sampled with (the
  fixture's batch: temperature 1.5, top-p 0.9), so these settings need no refusal."""
  config_checks.check_config(_config("sampler", **{
      "rollout.temperature": "1.5", "rollout.top_p": "0.9", "rollout.top_k": "5",
      "rollout.min_p": "0.05"}))


def test_run_epochs_returns_each_rows_output_in_batch_order():
  """2 epochs x 4 minibatches of 8 shuffled rows: the rows' outputs come back from the first
  epoch, row i's at position i (each minibatch update outputs its rows' ids and its index)."""
  ids = jnp.arange(8)

  def minibatch_update(state, minibatch, index):
    rows = {"id": minibatch, "update": jnp.broadcast_to(index, minibatch.shape)}
    return state + 1, ({"n": (jnp.float32(minibatch.shape[0]), jnp.float32(1))}, rows)

  state, metrics, rows = update_lib.run_epochs(
      minibatch_update, jnp.int32(0), ids, jax.random.PRNGKey(0), epochs=2, minibatches=4,
      indexed=True, row_outputs=True)
  assert int(state) == 8 and float(metrics["n"][0]) == 16
  np.testing.assert_array_equal(rows["id"], np.arange(8))
  assert sorted(np.asarray(rows["update"]).tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]  # epoch 0's

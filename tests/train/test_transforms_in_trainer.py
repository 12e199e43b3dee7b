"""Section 8 through the trainer: rollout rejection and IS weights in ``score``, on-policy
distillation with a teacher, micro-batch invariance of the new objectives and token masks, the
entropy controller across a resume, and ReMax's greedy baseline rollout."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.algorithm import resolve
from rljax.models import transformer, tiny_config
from rljax.train import build, generation, loop
from rljax.runs import metrics as metrics_lib
from rljax.learner import step as step_lib
from tests.train import tiny

B, PW, T, VOCAB, G = 8, 8, 8, 40, 4


def _config(preset="grpo", **overrides):
  merged = dict(tiny.OVERRIDES, **{"rollout.group_size": str(G)},
                **{k: str(v) for k, v in overrides.items()})
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", f"{preset}.py"),
                                   list(merged.items()))


def _setup(config, teacher_cfg=None):
  """(unjitted StepFns, initial state, hparams, model config, policy params)."""
  model_cfg = tiny_config(config.model, VOCAB)
  params = transformer.init_params(model_cfg, seed=0)
  algo = resolve(config)
  _, make = build.abstract_state(config, model_cfg, algo)
  aux_cfgs = () if teacher_cfg is None else (("opd", teacher_cfg),)
  fns = step_lib.step_fns(build.step_spec(config, model_cfg, algo, aux_cfgs))
  return fns, make(params), algo.hparams, model_cfg, params


def _reference_logp(model_cfg, params, rollout):
  """Completion log-probs from full float64 log-softmax of the logits (the reference)."""
  tokens = np.concatenate([rollout.prompt_tokens, rollout.tokens], 1)
  attn = np.concatenate([rollout.prompt_mask, rollout.mask], 1)
  logits = np.asarray(transformer.logits(model_cfg, params, jnp.asarray(tokens), jnp.asarray(attn)),
                      np.float64)[:, PW - 1:-1]
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  return np.take_along_axis(logits, rollout.tokens[..., None].astype(int), -1)[..., 0] - logz


def _initial_params():
  return transformer.init_params(tiny_config(_config().model, VOCAB), seed=0)


def _rollout(seed=0):
  rewards = np.random.default_rng(seed + 1).integers(0, 2, B)
  return tiny.synthetic_rollout(B, PW, T, VOCAB, rewards, seed)


# --- 8.2 rollout correction through score ----------------------------------------------------------

def _np_ratios(d, m, level):
  d = d * m
  x = {"token": d, "sequence": d.sum(1, keepdims=True),
       "geometric": d.sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1)}[level]
  return np.broadcast_to(np.exp(np.clip(x, -20, 20)), m.shape)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rejection_removes_exactly_the_out_of_range_entries(level):
  config = _config(**{"algo.rollout_rs": level, "algo.rollout_rs_lo": 0.5,
                      "algo.rollout_rs_hi": 2.0, "algo.rollout_is": "sequence",
                      "algo.rollout_is_cap": 1.5})
  fns, state, hp, model_cfg, params = _setup(config)
  rollout = _rollout()
  m = rollout.mask.astype(np.float64)
  old = _reference_logp(model_cfg, params, rollout)
  # d = old - sampler: one token far above hi, one far below lo, a row whose every token is
  # inside [lo, hi] but whose product is not; every other ratio is 1.
  d = np.zeros((B, T))
  d[0, 0], d[2, 0] = np.log(3.0), np.log(0.25)
  d[5, :] = 0.3
  assert m[0, 0] and m[2, 0] and m[5].sum() >= 3
  rollout = rollout.replace(sampler_logp=((old - d) * m).astype(np.float32))
  scored, metrics = jax.jit(fns.score)(state, rollout, hp)

  keep = (_np_ratios(d, m, level) >= 0.5) & (_np_ratios(d, m, level) <= 2.0)
  expected = m * keep
  np.testing.assert_array_equal(np.asarray(scored.loss_mask), expected)
  assert expected.sum() < m.sum()
  removed = (m > 0) & (expected == 0)
  assert float(metrics["rollout_rs/token_frac"][0]) == pytest.approx(removed.sum() / m.sum())
  # Advantages come before the rejection: the kept tokens' values do not depend on it.
  plain_fns, _, plain_hp, _, _ = _setup(_config())
  plain, _ = jax.jit(plain_fns.score)(state, rollout, plain_hp)
  np.testing.assert_allclose(np.asarray(scored.advantages) * expected,
                             np.asarray(plain.advantages) * expected, rtol=1e-6, atol=1e-6)
  # IS weights over the kept tokens: min(rho_seq, cap) on the kept mask.
  weights = np.minimum(_np_ratios(d, expected, "sequence"), 1.5) * expected
  np.testing.assert_allclose(np.asarray(scored.extras["is_weight"]), weights, rtol=1e-4,
                             atol=1e-5)
  # The mismatch metrics compare the sampler with the trainer's old log-probs, before rejection.
  k1 = ((-d) * m).sum() / m.sum()
  assert float(metrics["mismatch/k1"][0]) == pytest.approx(k1, rel=1e-3, abs=1e-5)


def test_mismatch_metrics_in_the_reused_forward():
  """One update per batch and no correction: scoring skips the policy, the loss's forward logs
  mismatch/ against the rollout's sampler_logp."""
  config = _config(**{"algo.kl_placement": "none"})
  fns, state, hp, model_cfg, params = _setup(config)
  rollout = _rollout(1)
  old = _reference_logp(model_cfg, params, rollout)
  rollout = rollout.replace(sampler_logp=((old - 0.1) * rollout.mask).astype(np.float32))
  scored, score_metrics = jax.jit(fns.score)(state, rollout, hp)
  assert scored.old_logp is None and "mismatch/k1" not in score_metrics
  _, metrics = jax.jit(fns.train_step)(state, scored, hp)
  assert float(metrics["mismatch/k1"][0]) == pytest.approx(-0.1, abs=1e-4)
  assert float(metrics["mismatch/abs_diff_max"][0]) == pytest.approx(0.1, abs=1e-4)


# --- 8.6 on-policy distillation --------------------------------------------------------------------

def test_distillation_adds_minus_the_reverse_kl_to_the_teacher():
  config = _config("opd", **{"teacher.source": "tiny", "algo.opd_coef": 0.5})
  model_cfg = tiny_config(config.model, VOCAB)
  fns, state, hp, _, params = _setup(config, teacher_cfg=model_cfg)
  no_teacher = _config("opd", **{"algo.opd_coef": 0.0, "teacher.source": ""})
  env_fns, _, env_hp, _, _ = _setup(no_teacher)
  rollout = _rollout(2)
  m = rollout.mask.astype(np.float64)
  env, _ = jax.jit(env_fns.score)(state, rollout, env_hp)
  # A teacher equal to the student adds nothing.
  same, metrics = jax.jit(fns.score)(state, rollout, hp, {"opd": params})
  np.testing.assert_allclose(np.asarray(same.advantages), np.asarray(env.advantages), atol=1e-6)
  assert float(metrics["opd/reverse_kl"][0]) == pytest.approx(0.0, abs=1e-5)
  # Another teacher: A = A_env - coef (old_logp - teacher_logp), each from a float64 reference.
  teacher = jax.tree.map(lambda p: p * 1.3, params)
  scored, metrics = jax.jit(fns.score)(state, rollout, hp, {"opd": teacher})
  rkl = (_reference_logp(model_cfg, params, rollout)
         - _reference_logp(model_cfg, teacher, rollout)) * m
  np.testing.assert_allclose(np.asarray(scored.advantages) - np.asarray(env.advantages),
                             -0.5 * rkl, rtol=1e-4, atol=1e-4)
  assert float(metrics["opd/reverse_kl"][0]) == pytest.approx(rkl.sum(), rel=1e-3)


# --- 8.5 pass@k: binary rewards checked on the host ------------------------------------------------

def test_passk_refuses_non_binary_rewards_on_the_host():
  from rljax.transforms.passk import check_binary_rewards
  check_binary_rewards(np.array([0.0, 1.0, 1.0]))
  with pytest.raises(ValueError, match="algo.advantage='passk'.*0.5"):
    check_binary_rewards(np.array([0.0, 0.5, 1.0]))


def test_a_nonfinite_teacher_logp_stops_the_run_with_its_step():
  from rljax.transforms.distill import check_teacher_logp
  check_teacher_logp({"opd/teacher_nonfinite": 0.0}, step=3)
  check_teacher_logp({}, step=3)  # no distillation
  with pytest.raises(FloatingPointError, match="step 3: .*NaN or infinite on 1.56%"):
    check_teacher_logp({"opd/teacher_nonfinite": 1 / 64}, step=3)


# --- micro-batch invariance of the new objectives and masks ----------------------------------------

INVARIANCE = {
    "clip_cov+entropy_mask+correction": {
        "algo.policy_loss": "clip_cov", "algo.clip_cov_ratio": 0.1, "algo.clip_cov_lb": -10.0,
        "algo.clip_cov_ub": 10.0, "algo.entropy_top_rho": 0.3, "algo.rollout_is": "token",
        "algo.rollout_rs": "token", "algo.rollout_rs_lo": 0.8, "algo.rollout_rs_hi": 1.25,
        "algo.entropy_ctrl": "true", "algo.entropy_target": 10.0},
    "sapo_sequence": {"algo.policy_loss": "sapo", "algo.sapo_level": "sequence"},
}


def _invariance_step(overrides, micro):
  # optim.eps 1e-3: Adam's step lr m / (sqrt(v) + eps) is then at most lr |g| / eps, so float32
  # summation-order noise in a gradient entry (~1e-7 of the sum of its terms, which differs with
  # the micro-batch split and between CPUs) moves a parameter by ~lr 1e-7 |g| / eps, far below
  # the tolerances below. With the default eps 1e-8 an entry whose gradient is ~0 is normalised
  # to a step of up to lr whatever its sign, and the noise shows at the scale of lr.
  # model.pack=False: the padded rows' split ('auto' would pack the micro-batches on CPU; the
  # packed split is tests/train/test_packed_step.py's).
  config = _config(**{"algo.micro_batches": micro, "algo.minibatches": 2, "algo.epochs": 2,
                      "algo.entropy_coef": 0.01, "algo.kl_placement": "loss",
                      "optim.eps": 1e-3, "model.pack": "False"}, **overrides)
  fns, state, hp, model_cfg, params = _setup(config)
  rollout = _rollout(3)
  old = _reference_logp(model_cfg, params, rollout)
  noise = np.random.default_rng(4).normal(scale=0.15, size=old.shape)
  rollout = rollout.replace(sampler_logp=((old + noise) * rollout.mask).astype(np.float32))
  batch, _ = jax.jit(fns.score)(state, rollout, hp)
  batch = batch.replace(old_logp=batch.old_logp + 0.3 * jnp.sin(jnp.arange(T))[None])
  return jax.jit(fns.train_step)(state, batch, hp)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(INVARIANCE))
def test_micro_batches_leave_the_section8_update_unchanged(case):
  ref_state, ref = _invariance_step(INVARIANCE[case], 1)
  state, metrics = _invariance_step(INVARIANCE[case], 2)
  np.testing.assert_allclose(float(metrics["loss"][0]), float(ref["loss"][0]), rtol=1e-5,
                             atol=1e-6)
  # Parameters moved by ~lr = 1e-3 per update; a wrong micro-batch aggregation changes a step
  # by a large fraction of that, float noise by ~1e-10 (see optim.eps above).
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(
      jax.tree.leaves(ref_state.params), jax.tree.leaves(_initial_params())))
  assert moved > 1e-4
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert jax.tree.structure(state.transforms) == jax.tree.structure(ref_state.transforms)
  for a, b in zip(jax.tree.leaves(state.transforms), jax.tree.leaves(ref_state.transforms)):
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
  # The selections really selected a strict subset (the comparison is not vacuous).
  for name in ("clip_cov/frac", "kl_cov/frac"):
    if name in ref:
      assert 0 < float(ref[name][0]) < float(ref[name][1])
  if "entropy_mask/kept_frac" in ref:
    assert 0 < float(ref["entropy_mask/kept_frac"][0]) < float(ref["entropy_mask/kept_frac"][1])


# --- 8.7 the entropy controller across a checkpoint ------------------------------------------------

@pytest.mark.slow
def test_entropy_controller_state_survives_a_resume(tmp_path):
  """Target above any entropy: c grows by delta each step. A resumed step 3 must apply the c
  the first run ended with (2 delta), not a fresh c_0 = 0."""
  delta = 1e-3
  extra = {"algo.entropy_ctrl": "true", "algo.entropy_target": "100.0",
           "algo.entropy_coef_delta": str(delta), "algo.entropy_coef_max": "1.0",
           "algo.entropy_coef": "0.0", "algo.kl_placement": "none"}
  run_dir = str(tmp_path / "ctrl")
  first = cli.main(tiny.args("grpo", run_dir, extra))
  assert float(first["state"].transforms["entropy_ctrl"].coef) == pytest.approx(2 * delta)
  resumed = cli.main(tiny.args("grpo", run_dir, dict(extra, **{"train.steps": "3",
                                                                 "train.resume": "true"})))
  records = [r for r in metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
             if "loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3]
  assert [r["entropy_ctrl/applied"] for r in records] == pytest.approx([0.0, delta, 2 * delta])
  assert float(resumed["state"].transforms["entropy_ctrl"].coef) == pytest.approx(3 * delta)
  assert all(r["entropy_loss"] < 0 for r in records)  # the bonus is on from c_0 = 0


# --- 8.8 ReMax's greedy baseline rollout -----------------------------------------------------------

@pytest.mark.slow
def test_remax_baseline_is_one_greedy_completion_per_prompt(tmp_path, monkeypatch):
  config = _config("remax", **{"train.run_dir": str(tmp_path / "remax")})
  calls = []
  real = generation.generate

  def recording(gen, params, problems, key, sampling, group_size, newest=None):
    out = real(gen, params, problems, key, sampling, group_size, newest)
    calls.append((sampling, group_size, out[0], params))
    return out

  monkeypatch.setattr(generation, "generate", recording)
  run = build.build_run(config)
  try:
    batch, info = loop.collect_batch(run, 0)
  finally:
    run.writer.close()
    run.checkpointer.close()
  (sampled, g, rollout, _), (greedy, one, baseline_out, params) = calls
  assert not sampled.greedy and g == G and greedy.greedy and one == 1
  np.testing.assert_array_equal(batch.extras["remax_baseline"],
                                np.repeat(baseline_out.rewards, G))
  assert info["remax/generated_tokens"] == float(baseline_out.lengths.sum()) > 0
  assert info["sec_remax"] > 0
  # Greedy: every generated token is the argmax of the policy's logits at its position.
  width = baseline_out.prompt_tokens.shape[1]
  tokens = np.concatenate([baseline_out.prompt_tokens, baseline_out.tokens], 1)
  attn = np.concatenate([baseline_out.prompt_mask, baseline_out.mask], 1)
  logits = np.asarray(transformer.logits(run.engine.model_cfg, params, jnp.asarray(tokens),
                                   jnp.asarray(attn)))[:, width - 1:-1]
  valid = baseline_out.mask > 0
  np.testing.assert_array_equal(logits.argmax(-1)[valid], baseline_out.tokens[valid])

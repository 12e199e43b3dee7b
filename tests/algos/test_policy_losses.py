"""Policy objectives (ALGORITHMS.md section 3): values, gradients and diagnostics vs NumPy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos import losses
from rljax.algorithm import resolve

from .helpers import cast, jit, log_ratios, prefix_mask

B, T = 8, 5
CLAMP = 20.0


# --- NumPy references ----------------------------------------------------------------------------

def np_delta(logp, old):
  return np.clip(logp - old, -CLAMP, CLAMP)


def np_agg_weights(mode, mask, norm_constant=None):
  """``w[i, t]`` with ``aggregate = sum_{i,t} w l`` (ALGORITHMS.md section 4)."""
  m = (mask > 0).astype(np.float64)
  lengths = m.sum(1)
  num_seqs = (lengths > 0).sum()
  if mode == "token_mean":
    return m / m.sum()
  if mode == "seq_mean_token_mean":
    return m / np.maximum(lengths, 1)[:, None] / num_seqs
  if mode == "seq_mean_token_sum":
    return m / num_seqs
  if mode == "seq_mean_token_sum_norm":
    c = mask.shape[1] if norm_constant is None else norm_constant
    return m / c / num_seqs
  raise ValueError(mode)


def np_ppo_clip(ratio, adv, el, eh, dual_c):
  """``(loss, d loss / d ratio, clip_low, clip_high, dual)``, elementwise."""
  s1 = -adv * ratio
  s2 = -adv * np.clip(ratio, 1 - el, 1 + eh)
  loss = np.maximum(s1, s2)
  dloss = np.where(s1 >= s2, -adv, 0.0)
  low = (adv < 0) & (ratio < 1 - el)
  high = (adv > 0) & (ratio > 1 + eh)
  dual = np.zeros_like(low)
  if dual_c is not None:
    dual = (adv < 0) & (loss > -adv * dual_c)
    loss = np.where(dual, -adv * dual_c, loss)
    dloss = np.where(dual, 0.0, dloss)
  return loss, dloss, low, high, dual


def np_objective(name, logp, old, adv, mask, keys):
  """Per-token ``(loss, d loss / d logp, metrics)``; gmpo: per-sequence loss ``[B]``."""
  logp, old, adv = (x.astype(np.float64) for x in (logp, old, adv))
  raw = logp - old
  d = np_delta(logp, old)
  r = np.exp(d)
  inside = np.abs(raw) <= CLAMP  # the clamp has zero gradient outside
  valid = mask > 0
  lengths = np.maximum(valid.sum(1), 1)
  zeros = np.zeros_like(r, bool)
  if name in ("ppo", "gspo"):
    if name == "ppo":
      ratio = r
    else:
      ratio = np.repeat(np.exp((d * valid).sum(1) / lengths)[:, None], mask.shape[1], 1)
    loss, dratio, low, high, dual = np_ppo_clip(ratio, adv, keys["clip_eps_low"],
                                                keys["clip_eps_high"], keys["dual_clip_c"])
    grad = dratio * ratio * (inside if name == "ppo" else 1.0)
    metrics = dict(clip_frac_low=low, clip_frac_high=high, ratio_mean=ratio, approx_kl=-d,
                   dual_clip_frac=dual)
  elif name == "cispo":
    w = np.minimum(r, 1 + keys["cispo_eps_high"])
    low = zeros
    if keys["cispo_eps_low"] is not None:
      w = np.maximum(w, 1 - keys["cispo_eps_low"])
      low = r < 1 - keys["cispo_eps_low"]
    loss, grad = -w * adv * logp, -w * adv
    metrics = dict(clip_frac_low=low, clip_frac_high=r > 1 + keys["cispo_eps_high"],
                   ratio_mean=r, approx_kl=-d)
  elif name == "gmpo":
    eps = keys["gmpo_eps"]
    a_seq = (adv * valid).sum(1) / lengths
    s = np.sign(a_seq)[:, None]
    lt = s * np.minimum(s * d, s * np.clip(d, -eps, eps))
    loss = -a_seq * np.exp((lt * valid).sum(1) / lengths)
    dlt = np.where(s > 0, d < eps, np.where(s < 0, d > -eps, 0.0)) * inside
    grad = loss[:, None] * dlt / lengths[:, None]
    metrics = dict(clip_frac_low=(s < 0) & (d < -eps), clip_frac_high=(s > 0) & (d > eps),
                   ratio_mean=r, approx_kl=-d)
  elif name == "pg":
    loss, grad = -adv * logp, -adv
    metrics = dict(clip_frac_low=zeros, clip_frac_high=zeros, ratio_mean=r, approx_kl=-d)
  else:
    raise ValueError(name)
  metrics = {k: ((v * valid).sum(), valid.sum()) for k, v in metrics.items()}
  return loss, grad, metrics


def np_total(name, loss, grad, mask, mode, norm_constant=None):
  """Aggregate value and gradient w.r.t. logp of the whole minibatch."""
  if name == "gmpo":
    valid_rows = (mask > 0).any(1)
    n = valid_rows.sum()
    return (loss * valid_rows).sum() / n, grad * valid_rows[:, None] * (mask > 0) / n
  w = np_agg_weights(mode, mask, norm_constant)
  return (w * loss).sum(), w * grad


# --- inputs --------------------------------------------------------------------------------------

CASES = {
    # name: (objective, config keys)
    "ppo": ("ppo", dict(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip_c=None)),
    "ppo_dual": ("ppo", dict(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip_c=3.0)),
    "gspo": ("gspo", dict(clip_eps_low=3e-4, clip_eps_high=4e-4, dual_clip_c=None)),
    "gspo_wide": ("gspo", dict(clip_eps_low=0.2, clip_eps_high=0.3, dual_clip_c=2.0)),
    "cispo": ("cispo", dict(cispo_eps_high=4.0, cispo_eps_low=None)),
    "cispo_low": ("cispo", dict(cispo_eps_high=0.3, cispo_eps_low=0.2)),
    "gmpo": ("gmpo", dict(gmpo_eps=0.4)),
    "pg": ("pg", dict()),
}


def make_inputs(seed, dtype, per_row_adv):
  rng = np.random.default_rng(seed)
  mask = prefix_mask(rng, B, T)
  logp = -rng.uniform(0.01, 6.0, size=(B, T))
  old = logp - log_ratios(rng, (B, T))
  if per_row_adv:
    adv = np.repeat(rng.normal(size=(B, 1)), T, 1)
    adv[0] = 0.0
  else:
    adv = rng.normal(size=(B, T))
    adv[rng.random((B, T)) < 0.1] = 0.0
  adv = adv * mask
  return cast(dtype, logp, old, adv, mask)


def configure(algo_cfg, case, loss_agg="seq_mean_token_mean", **extra):
  name, keys = CASES[case]
  algo_cfg.policy_loss = name
  algo_cfg.loss_agg = loss_agg
  for k, v in {**keys, **extra}.items():
    setattr(algo_cfg, k, v)
  return name, keys


def loss_value_and_grad(algo_cfg, logp, old, adv, mask, is_weight=None):
  """The minibatch loss ``sum / count``, its gradient w.r.t. logp, and the metrics."""
  algo = resolve(algo_cfg)

  @jit
  def f(logp, old, adv, mask, is_weight):
    def total(lp):
      s, metrics = algo.policy_loss_sum(logp=lp, old_logp=old, advantages=adv, mask=mask,
                                        is_weight=is_weight)
      return s / algo.policy_loss_count(mask), metrics
    return jax.value_and_grad(total, has_aux=True)(logp)

  (value, metrics), grad = f(logp, old, adv, mask, is_weight)
  return value, grad, metrics


def close(actual, expected, prec, scale=1.0):
  np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=prec.rtol,
                             atol=prec.rtol * scale)


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_objective_value_gradient_metrics(prec, algo_cfg, case):
  """Value, jax.grad w.r.t. logp (zero where clipped) and diagnostics against NumPy."""
  name, keys = configure(algo_cfg, case)
  per_row = name in ("gspo", "gmpo")
  logp, old, adv, mask = make_inputs(list(CASES).index(case), prec.dtype, per_row)
  value, grad, metrics = loss_value_and_grad(algo_cfg, logp, old, adv, mask)
  loss, dloss, np_metrics = np_objective(name, logp, old, adv, mask, keys)
  expected_value, expected_grad = np_total(name, loss, dloss, mask, "seq_mean_token_mean")
  scale = np.abs(expected_grad).max()
  assert np.asarray(value).dtype == prec.dtype
  close(value, expected_value, prec, scale=max(1.0, abs(expected_value)))
  close(grad, expected_grad, prec, scale=scale)
  assert set(metrics) == set(np_metrics)
  for key, (s, c) in np_metrics.items():
    close(metrics[key][1], c, prec)
    close(metrics[key][0], s, prec, scale=max(1.0, abs(s)))


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                                  "seq_mean_token_sum_norm"])
def test_ppo_under_each_aggregation(x64, algo_cfg, mode):
  """float64 only: the float32 path of each aggregation is covered by test_loss_agg."""
  prec = x64
  name, keys = configure(algo_cfg, "ppo_dual", loss_agg=mode, loss_norm_constant=None)
  logp, old, adv, mask = make_inputs(3, prec.dtype, False)
  value, grad, _ = loss_value_and_grad(algo_cfg, logp, old, adv, mask)
  loss, dloss, _ = np_objective(name, logp, old, adv, mask, keys)
  expected_value, expected_grad = np_total(name, loss, dloss, mask, mode)
  close(value, expected_value, prec, scale=max(1.0, abs(expected_value)))
  close(grad, expected_grad, prec, scale=np.abs(expected_grad).max())


def test_forced_aggregations(algo_cfg):
  algo_cfg.entropy_coef = 0.01
  for objective, forced in [("gspo", "seq_mean_token_mean"), ("gmpo", losses.SEQUENCE_MEAN)]:
    algo_cfg.policy_loss, algo_cfg.loss_agg = objective, "token_mean"
    assert resolve(algo_cfg).policy_agg == forced
  algo_cfg.policy_loss = "gmpo"
  entropy, = [r for r in resolve(algo_cfg).regularizers if r.name == "entropy"]
  assert entropy.agg == "seq_mean_token_mean"
  algo_cfg.policy_loss, algo_cfg.loss_agg = "ppo", "token_mean"
  assert resolve(algo_cfg).policy_agg == "token_mean"
  algo_cfg.loss_agg = losses.SEQUENCE_MEAN  # one loss per sequence, for a per-token objective
  with pytest.raises(ValueError, match="algo.loss_agg='sequence_mean'"):
    resolve(algo_cfg)


def _sequence_gspo(logp, old, adv_rows, mask, el, eh):
  """Sequence-level GSPO (2507.18071 eq. 5): ``mean_i max(-A_i s_i, -A_i clip(s_i))``."""
  valid = mask > 0
  lengths = jnp.maximum(valid.sum(1), 1)
  d = jnp.clip(logp - old, -CLAMP, CLAMP)
  s = jnp.exp(jnp.where(valid, d, 0).sum(1) / lengths)
  per_seq = jnp.maximum(-adv_rows * s, -adv_rows * jnp.clip(s, 1 - el, 1 + eh))
  rows = valid.any(1)
  return jnp.where(rows, per_seq, 0).sum() / rows.sum()


def test_gspo_token_equals_sequence_gspo(prec, algo_cfg):
  """With a per-sequence advantage, GSPO-token == sequence GSPO in value and gradient."""
  configure(algo_cfg, "gspo_wide", dual_clip_c=None)
  rng = np.random.default_rng(4)
  mask = prefix_mask(rng, B, T)
  logp = -rng.uniform(0.01, 3.0, size=(B, T))
  old = logp - rng.normal(scale=0.4, size=(B, T))  # some sequences inside, some clipped
  adv_rows = rng.normal(size=B)
  logp, old, adv_rows, mask = cast(prec.dtype, logp, old, adv_rows, mask)
  adv = adv_rows[:, None] * mask
  value, grad, metrics = loss_value_and_grad(algo_cfg, logp, old, adv, mask)
  seq_value, seq_grad = jit(jax.value_and_grad(_sequence_gspo), static_argnums=(4, 5))(
      logp, old, adv_rows, mask, 0.2, 0.3)
  assert 0 < float(metrics["clip_frac_low"][0] + metrics["clip_frac_high"][0])
  assert float(metrics["clip_frac_low"][0] + metrics["clip_frac_high"][0]) < float(
      metrics["clip_frac_low"][1])
  close(value, np.asarray(seq_value), prec, scale=1.0)
  close(grad, np.asarray(seq_grad), prec, scale=np.abs(np.asarray(seq_grad)).max())


@pytest.mark.parametrize("case", ["ppo_dual", "gmpo", "gspo_wide"])
def test_gradient_matches_central_differences(x64, algo_cfg, case):
  """jax.grad of the whole minibatch loss vs central finite differences (float64)."""
  name, _ = configure(algo_cfg, case)
  logp, old, adv, mask = make_inputs(5, np.float64, per_row_adv=name in ("gspo", "gmpo"))
  _, grad, _ = loss_value_and_grad(algo_cfg, logp, old, adv, mask)
  h = 1e-6
  eye = np.eye(B * T).reshape(B * T, B, T) * h

  algo = resolve(algo_cfg)

  @jit
  def losses_at(points):
    def one(lp):
      s, _ = algo.policy_loss_sum(logp=lp, old_logp=old, advantages=adv, mask=mask)
      return s / algo.policy_loss_count(mask)
    return jax.vmap(one)(points)

  fd = (np.asarray(losses_at(logp + eye)) - np.asarray(losses_at(logp - eye))) / (2 * h)
  np.testing.assert_allclose(np.asarray(grad).reshape(-1), fd,
                             rtol=1e-5, atol=1e-6 * max(1.0, np.abs(fd).max()))


def test_truncated_importance_sampling(prec, algo_cfg):
  name, keys = configure(algo_cfg, "ppo", tis_cap=2.0)
  logp, old, adv, mask = make_inputs(6, prec.dtype, False)
  sampler = (old - np.random.default_rng(6).normal(scale=1.0, size=old.shape)).astype(prec.dtype)
  weights = np.minimum(np.exp(np.clip(old.astype(np.float64) - sampler, -CLAMP, CLAMP)), 2.0)
  # tis_cap is the alias of rollout_is='token' (8.2): the trainer computes these weights once
  # per batch (the rollout_correction transform) and the loss multiplies its policy term.
  algo = resolve(algo_cfg)
  assert algo.loss_weights == ("is_weight",) and algo.hparams["rollout_is_cap"] == 2.0
  value, grad, _ = loss_value_and_grad(algo_cfg, logp, old, adv, mask,
                                       (weights * mask).astype(prec.dtype))
  loss, dloss, _ = np_objective(name, logp, old, adv, mask, keys)
  expected_value, expected_grad = np_total(name, loss * weights, dloss * weights, mask,
                                           "seq_mean_token_mean")
  close(value, expected_value, prec, scale=max(1.0, abs(expected_value)))
  close(grad, expected_grad, prec, scale=np.abs(expected_grad).max())


def test_tis_errors(algo_cfg):
  logp, old, adv, mask = make_inputs(7, np.float32, True)
  configure(algo_cfg, "ppo", tis_cap=2.0)
  with pytest.raises(ValueError, match="is_weight"):
    resolve(algo_cfg).policy_loss_sum(logp=logp, old_logp=old, advantages=adv, mask=mask)
  configure(algo_cfg, "ppo", tis_cap=2.0, rollout_is="sequence")
  with pytest.raises(ValueError, match="algo.tis_cap.*alias.*algo.rollout_is"):
    resolve(algo_cfg)
  algo_cfg.rollout_is = "none"
  configure(algo_cfg, "gmpo", tis_cap=2.0)
  with pytest.raises(ValueError, match="one loss per sequence"):
    resolve(algo_cfg)


def test_extreme_ratios_stay_finite(algo_cfg):
  """log-ratios of +-1000 are clamped before exp: losses and gradients stay finite."""
  logp = np.zeros((2, 3), np.float32)
  old = np.array([[1000., -1000., 0.], [-1000., 1000., 0.]], np.float32)
  adv = np.array([[1., -1., 1.], [1., -1., 1.]], np.float32)
  mask = np.ones((2, 3), np.float32)
  for case in ["ppo", "gspo", "cispo", "gmpo"]:
    configure(algo_cfg, case)
    value, grad, metrics = loss_value_and_grad(algo_cfg, logp, old, adv, mask)
    assert np.isfinite(float(value)), case
    assert np.all(np.isfinite(np.asarray(grad))), case
    assert all(np.isfinite(float(s)) for s, _ in metrics.values()), case


def test_config_errors_name_the_key(algo_cfg):
  algo_cfg.policy_loss = "ppoo"
  with pytest.raises(KeyError, match="algo.policy_loss.*cispo, clip_cov, gmpo, gspo, kl_cov, pg, ppo, sapo"):
    resolve(algo_cfg)
  algo_cfg.policy_loss, algo_cfg.loss_agg = "gspo", "tokenmean"
  with pytest.raises(ValueError, match="algo.loss_agg.*seq_mean_token_mean"):
    resolve(algo_cfg)
  algo_cfg.policy_loss, algo_cfg.loss_agg, algo_cfg.dual_clip_c = "ppo", "token_mean", 0.5
  with pytest.raises(ValueError, match="algo.dual_clip_c"):
    resolve(algo_cfg)


@pytest.mark.parametrize("case", ["ppo_dual", "gspo_wide"])
def test_dual_clip_from_the_config_binds_and_matches_the_formula(prec, algo_cfg, case):
  """``algo.dual_clip_c`` reaches the objective through ``resolve`` (it was silently dropped by
  the registry once) on inputs where the dual clip binds on at least a quarter of the tokens:
  ``A < 0`` and a ratio above ``c``, so ``min(max(-A r, -A clip(r)), -A c) = -A c`` (ALGORITHMS.md
  section 3)."""
  name, keys = configure(algo_cfg, case)
  rng = np.random.default_rng(11)
  mask = np.ones((B, T))
  mask[-1, 2:] = 0.0
  logp = -rng.uniform(0.01, 3.0, size=(B, T))
  if name == "ppo":
    adv = np.where(rng.random((B, T)) < 0.5, -rng.uniform(0.5, 2.0, (B, T)), rng.normal(size=(B, T)))
    old = logp - np.where(adv < 0, np.log(rng.uniform(4.0, 9.0, (B, T))), rng.normal(0, 0.3, (B, T)))
  else:  # one sequence ratio per row: rows with A < 0 get a mean log-ratio above log c
    rows = np.arange(B) % 2 == 0
    adv = np.where(rows, -1.5, 0.7)[:, None] * np.ones((B, T))
    old = logp - np.where(rows[:, None], np.log(4.0), 0.05)
  adv = adv * mask
  logp, old, adv, mask = cast(prec.dtype, logp, old, adv, mask)
  value, grad, metrics = loss_value_and_grad(algo_cfg, logp, old, adv, mask)
  dual_sum, dual_count = (float(x) for x in metrics["dual_clip_frac"])
  assert dual_sum / dual_count >= 0.25, "the inputs must make the dual clip bind"
  loss, dloss, np_metrics = np_objective(name, logp, old, adv, mask, keys)
  expected_value, expected_grad = np_total(name, loss, dloss, mask, "seq_mean_token_mean")
  close(value, expected_value, prec, scale=max(1.0, abs(expected_value)))
  close(grad, expected_grad, prec, scale=np.abs(expected_grad).max())
  close(dual_sum, np_metrics["dual_clip_frac"][0], prec)
  # Without the dual clip the same inputs give another loss: the key is not a no-op.
  algo_cfg.dual_clip_c = None
  undual, _, _ = loss_value_and_grad(algo_cfg, logp, old, adv, mask)
  assert abs(float(undual) - float(value)) > 0.1 * abs(float(value))

"""SAPO (ALGORITHMS.md 8.1): value, gradient, metrics and the 8.9 acceptance items vs NumPy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos import losses, sapo

from .helpers import jit, log_ratios, prefix_mask, central_difference

B, T = 8, 5


def aggregate(mode, values, mask):
  """The aggregate of one whole minibatch, ``agg_sum / agg_count`` (section 4)."""
  return losses.agg_sum(mode, values, mask) / losses.agg_count(mode, mask)


# --- NumPy references (the sheet's, float64) -----------------------------------------------------

def np_sapo_loss(logp, old_logp, A, tau_pos=1.0, tau_neg=1.05):
  r = np.exp(np.clip(logp - old_logp, -20, 20)); tau = np.where(A > 0, tau_pos, tau_neg)
  return -A * (4.0 / tau) / (1.0 + np.exp(-tau * (r - 1.0)))     # l[i,t]


def np_sapo_grad(logp, old_logp, A, tau_pos, tau_neg):
  """``dl/dlogp = -A w r``, ``w = 4 s (1 - s)`` (0 outside the clamp)."""
  raw = logp - old_logp
  r = np.exp(np.clip(raw, -20, 20)); tau = np.where(A > 0, tau_pos, tau_neg)
  s = 1.0 / (1.0 + np.exp(-tau * (r - 1.0)))
  return -A * 4 * s * (1 - s) * r * (np.abs(raw) < 20)


def np_seq_mean(values, mask):
  valid = mask > 0
  rows = valid.any(1)
  return ((values * valid).sum(1)[rows] / valid.sum(1)[rows]).mean()


def np_sapo_sequence(logp, old_logp, A, mask, tau_pos, tau_neg):
  """Row losses ``-A_i (4/tau_i) sigma(tau_i (s_i - 1))`` and their mean over non-empty rows."""
  valid = mask > 0
  n = np.maximum(valid.sum(1), 1)
  s = np.exp((np.clip(logp - old_logp, -20, 20) * valid).sum(1) / n)
  a = (A * valid).sum(1) / n
  tau = np.where(a > 0, tau_pos, tau_neg)
  row = -a * (4.0 / tau) / (1.0 + np.exp(-tau * (s - 1.0)))
  return row, row[valid.any(1)].mean()


def make_inputs(seed, per_row_adv=False):
  rng = np.random.default_rng(seed)
  mask = prefix_mask(rng, B, T, np.float64)
  logp = -rng.uniform(0.01, 6.0, size=(B, T))
  old = logp - log_ratios(rng, (B, T))
  adv = np.repeat(rng.normal(size=(B, 1)), T, 1) if per_row_adv else rng.normal(size=(B, T))
  adv[0] = 0.0
  return logp, old, adv * mask, mask


TAUS = dict(tau_pos=1.0, tau_neg=1.05)


def _token_loss_and_grad(logp, old, adv, mask, taus):
  def total(lp):
    loss, metrics = sapo.sapo_loss(lp, old, adv, mask, **taus)
    return jnp.where(mask > 0, loss, 0).sum(), (loss, metrics)
  return jax.grad(total, has_aux=True)(logp)


@pytest.mark.parametrize("taus", [TAUS, dict(tau_pos=0.5, tau_neg=3.0)])
def test_token_loss_gradient_and_metrics(x64, taus):
  logp, old, adv, mask = make_inputs(0)
  grad, (loss, metrics) = jit(lambda *a: _token_loss_and_grad(*a, taus))(logp, old, adv, mask)
  np.testing.assert_allclose(np.asarray(loss), np_sapo_loss(logp, old, adv, **taus),
                             rtol=1e-6, atol=1e-12)
  np.testing.assert_allclose(np.asarray(grad), np_sapo_grad(logp, old, adv, **taus) * mask,
                             rtol=1e-6, atol=1e-12)
  valid = mask > 0
  r = np.exp(np.clip(logp - old, -20, 20))
  tau = np.where(adv > 0, taus["tau_pos"], taus["tau_neg"])
  s = 1 / (1 + np.exp(-tau * (r - 1)))
  w = 4 * s * (1 - s)
  expected = {
      "ratio_mean": (r[valid].sum(), valid.sum()),
      "approx_kl": (-np.clip(logp - old, -20, 20)[valid].sum(), valid.sum()),
      "sapo/gate_w_pos": (w[valid & (adv > 0)].sum(), (valid & (adv > 0)).sum()),
      "sapo/gate_w_neg": (w[valid & (adv <= 0)].sum(), (valid & (adv <= 0)).sum()),
      "sapo/soft_clip_frac": ((w[valid] < 0.5).sum(), valid.sum()),
  }
  assert set(metrics) == set(expected)
  for key, (total, count) in expected.items():
    np.testing.assert_allclose(float(metrics[key][0]), total, rtol=1e-6, err_msg=key)
    assert float(metrics[key][1]) == count, key
  assert 0 < expected["sapo/soft_clip_frac"][0] < valid.sum()  # both regions exercised


def test_at_ratio_one_loss_is_minus_two_a_over_tau_and_gradient_is_pg(x64):
  _, _, adv, mask = make_inputs(1)
  logp = -np.random.default_rng(1).uniform(0.1, 3.0, size=(B, T))
  grad, (loss, _) = jit(lambda *a: _token_loss_and_grad(*a, TAUS))(logp, logp, adv, mask)
  tau = np.where(adv > 0, TAUS["tau_pos"], TAUS["tau_neg"])
  np.testing.assert_allclose(np.asarray(loss), -2 * adv / tau, rtol=1e-12, atol=1e-15)
  pg_grad = jax.grad(lambda lp: jnp.where(mask > 0, losses.pg_loss(lp, logp, adv, mask)[0],
                                          0).sum())(logp)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(pg_grad), rtol=1e-12, atol=1e-15)


def test_saturated_gate_is_finite_and_flat(x64):
  old = np.zeros((2, 3))
  logp = np.array([[20.0, -20.0, 25.0], [-25.0, 19.5, -19.5]])
  adv = np.array([[1.0, -1.0, 2.0], [-2.0, 0.5, 1.0]])
  mask = np.ones((2, 3))
  grad, (loss, _) = jit(lambda *a: _token_loss_and_grad(*a, TAUS))(logp, old, adv, mask)
  assert np.isfinite(np.asarray(loss)).all() and np.isfinite(np.asarray(grad)).all()
  np.testing.assert_allclose(np.asarray(grad), 0.0, atol=1e-7)
  np.testing.assert_allclose(np.asarray(loss), np_sapo_loss(logp, old, adv), rtol=1e-12)


def test_gradients_match_central_differences(x64):
  rng = np.random.default_rng(2)
  mask = prefix_mask(rng, 4, 3, np.float64)
  logp = -rng.uniform(0.1, 3.0, size=(4, 3))
  old = logp - rng.normal(scale=0.5, size=(4, 3))
  adv = np.repeat(rng.normal(size=(4, 1)), 3, 1) * mask

  for fn in (sapo.sapo_loss, sapo.sapo_sequence_loss):
    def total(lp, fn=fn):
      loss, _ = fn(lp, old, adv, mask, **TAUS)
      return aggregate("seq_mean_token_mean", loss, mask)
    grad = np.asarray(jit(jax.grad(total))(logp))
    total = jit(total)
    numeric = central_difference(lambda lp: float(total(lp)), logp)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9, err_msg=fn.__name__)


def test_sequence_form_value_and_empty_rows(x64):
  logp, old, adv, mask = make_inputs(3, per_row_adv=True)
  assert ((mask > 0).sum(1) == 0).any() and ((mask > 0).sum(1) == 1).any()
  loss, metrics = jit(lambda *a: sapo.sapo_sequence_loss(*a, tau_pos=0.8, tau_neg=1.3))(
      logp, old, adv, mask)
  row, expected = np_sapo_sequence(logp, old, adv, mask, 0.8, 1.3)
  np.testing.assert_allclose(np.asarray(loss), row[:, None] * mask, rtol=1e-6, atol=1e-12)
  np.testing.assert_allclose(float(aggregate("seq_mean_token_mean", loss, mask)),
                             expected, rtol=1e-6)
  assert float(metrics["ratio_mean"][1]) == mask.sum()


def test_token_form_aggregate_skips_empty_rows(x64):
  logp, old, adv, mask = make_inputs(4)
  loss, _ = sapo.sapo_loss(logp, old, adv, mask, **TAUS)
  np.testing.assert_allclose(float(aggregate("seq_mean_token_mean", loss, mask)),
                             np_seq_mean(np_sapo_loss(logp, old, adv), mask), rtol=1e-6)


def test_float32_matches_reference():
  logp, old, adv, mask = make_inputs(5)
  loss, _ = jit(lambda *a: sapo.sapo_loss(*a, **TAUS))(
      *(x.astype(np.float32) for x in (logp, old, adv, mask)))
  assert np.asarray(loss).dtype == np.float32
  np.testing.assert_allclose(np.asarray(loss), np_sapo_loss(
      *(x.astype(np.float32).astype(np.float64) for x in (logp, old, adv))), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("taus", [dict(tau_pos=0.0, tau_neg=1.0), dict(tau_pos=1.0, tau_neg=-1.0)])
def test_temperatures_must_be_positive(taus):
  ones = np.ones((2, 2), np.float32)
  with pytest.raises(ValueError, match="algo.sapo_tau_(pos|neg)=.* out of range"):
    sapo.sapo_loss(ones, ones, ones, ones, **taus)

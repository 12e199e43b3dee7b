"""Clip-Cov and KL-Cov (ALGORITHMS.md 8.3): selection, losses and gradients vs the sheet's NumPy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos import cov, losses

from .helpers import jit, log_ratios, prefix_mask, central_difference

B, T = 8, 6


def aggregate(mode, values, mask):
  """The aggregate of one whole minibatch, ``agg_sum / agg_count`` (section 4)."""
  return losses.agg_sum(mode, values, mask) / losses.agg_count(mode, mask)


# --- the sheet's NumPy reference (float64) -------------------------------------------------------

def token_cov(A, lp, m):
    n = m.sum(); return (A - (A * m).sum() / n) * (lp - (lp * m).sum() / n)
def clip_cov_loss(logp, old_logp, A, m, u, eps_low=1.0, eps_high=1.0, ratio=2e-4, lb=1.0, ub=5.0, lp=None):
    r = np.exp(np.clip(logp - old_logp, -20, 20))
    l1, l2 = -A * r, -A * np.clip(r, 1 - eps_low, 1 + eps_high)
    c = token_cov(A, old_logp if lp is None else lp, m); cand = (m > 0) & (c > lb) & (c < ub)
    n = min(max(int(ratio * m.sum()), 1), int(cand.sum()))
    sel = np.zeros(m.size, bool); sel[np.argsort(np.where(cand, u, np.inf), axis=None, kind="stable")[:n]] = True
    return np.maximum(l1, l2) * (1 - sel.reshape(m.shape))
def kl_cov_loss(logp, old_logp, A, m, ratio=2e-3, coef=1.0, lp=None):
    delta = np.clip(logp - old_logp, -20, 20); c = token_cov(A, old_logp if lp is None else lp, m)
    sel = np.zeros(m.size, bool); N = int(m.sum())
    if N: sel[np.argsort(np.where(m.ravel() > 0, -c.ravel(), np.inf), kind="stable")[:max(1, int(ratio * N))]] = True
    return -A * np.exp(delta) + coef * np.abs(delta) * sel.reshape(m.shape)


def make_inputs(seed):
  rng = np.random.default_rng(seed)
  m = prefix_mask(rng, B, T, np.float64)
  old = -rng.uniform(0.01, 6.0, size=(B, T))
  logp = old + log_ratios(rng, (B, T))
  adv = np.repeat(rng.normal(scale=1.5, size=(B, 1)), T, 1) * m
  u = np.asarray(cov.selection_uniforms(seed, 3, 1, (B, T)))
  return logp, old, adv, m, u


def clip_cov_total(logp, old, adv, m, u, ratio, lb, ub, eps):
  sel, metrics = cov.clip_cov_select(old, adv, m, u, ratio=ratio, lb=lb, ub=ub)
  loss, _ = cov.clip_cov_loss(logp, old, adv, m, cov_sel=sel, eps_low=eps, eps_high=eps)
  return loss, sel, metrics


@pytest.mark.parametrize("ratio, lb, ub, eps", [(2e-4, 1.0, 5.0, 1.0), (0.1, 0.2, 5.0, 0.2),
                                                (0.5, 0.0, 2.0, 0.2), (1.0, -1.0, 50.0, 1.0)])
def test_clip_cov_matches_reference_and_counts(x64, ratio, lb, ub, eps):
  logp, old, adv, m, u = make_inputs(int(ratio * 1e4))
  loss, sel, metrics = clip_cov_total(logp, old, adv, m, u, ratio, lb, ub, eps)
  expected = clip_cov_loss(logp, old, adv, m, u, eps, eps, ratio, lb, ub)
  np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-6, atol=1e-12)
  c = token_cov(adv, old, m)
  cand = (m > 0) & (c > lb) & (c < ub)
  sel = np.asarray(sel)
  n = min(max(int(np.floor(ratio * m.sum())), 1), int(cand.sum()))
  assert sel.sum() == n and not (sel & ~cand).any()
  assert cand.sum() > 0
  assert float(metrics["clip_cov/frac"][0]) == n and float(metrics["clip_cov/frac"][1]) == m.sum()
  assert float(metrics["clip_cov/candidates"][0]) == cand.sum()
  np.testing.assert_allclose(float(metrics["cov/mean"][0]) / m.sum(), c[m > 0].mean(), rtol=1e-6,
                             atol=1e-12)


@pytest.mark.parametrize("ratio", [2e-3, 0.1, 0.5, 1.0])
def test_kl_cov_matches_reference_and_k(x64, ratio):
  logp, old, adv, m, _ = make_inputs(100 + int(ratio * 100))
  sel, metrics = cov.kl_cov_select(old, adv, m, ratio=ratio)
  loss, loss_metrics = cov.kl_cov_loss(logp, old, adv, m, cov_sel=sel, coef=0.7)
  np.testing.assert_allclose(np.asarray(loss), kl_cov_loss(logp, old, adv, m, ratio, 0.7),
                             rtol=1e-6, atol=1e-12)
  k = max(1, int(np.floor(ratio * m.sum())))
  assert np.asarray(sel).sum() == k and float(metrics["kl_cov/frac"][0]) == k
  assert not (np.asarray(sel) & (m == 0)).any()
  d = np.clip(logp - old, -20, 20)
  np.testing.assert_allclose(float(loss_metrics["kl_cov/abs_delta"][0]), np.abs(d)[m > 0].sum(),
                             rtol=1e-6)


def test_kl_cov_ties_go_to_the_lower_flat_index_and_empty_selects_nothing(x64):
  m = np.ones((4, 3))
  adv = np.array([[1.0] * 3, [1.0] * 3, [-1.0] * 3, [-1.0] * 3])
  old = np.array([[-0.5, -2.0, -0.5], [-0.5, -2.0, -0.5], [-2.0, -0.5, -2.0], [-2.0, -0.5, -2.0]])
  for ratio in (1 / 12, 3 / 12, 5 / 12):
    sel, _ = cov.kl_cov_select(old, adv, m, ratio=ratio)
    k = max(1, int(ratio * 12))
    want = np.zeros(12, bool)
    want[np.argsort(-token_cov(adv, old, m).ravel(), kind="stable")[:k]] = True
    np.testing.assert_array_equal(np.asarray(sel).ravel(), want)
  assert np.asarray(sel).ravel()[:2].tolist() == [True, False]  # tie between flat 0, 2, 3, 5
  sel, metrics = cov.kl_cov_select(old, adv, np.zeros_like(m), ratio=0.5)
  assert not np.asarray(sel).any() and float(metrics["kl_cov/frac"][0]) == 0


def test_kl_cov_coef_zero_is_unclipped_ratio_pg(x64):
  logp, old, adv, m, _ = make_inputs(7)
  sel, _ = cov.kl_cov_select(old, adv, m, ratio=0.5)

  def total(lp, coef):
    return jnp.where(m > 0, cov.kl_cov_loss(lp, old, adv, m, cov_sel=sel, coef=coef)[0], 0).sum()

  grad = np.asarray(jax.grad(total)(logp, 0.0))
  raw = logp - old
  r = np.exp(np.clip(raw, -20, 20))
  np.testing.assert_allclose(float(total(logp, 0.0)), (-adv * r * m).sum(), rtol=1e-12)
  np.testing.assert_allclose(grad, -adv * r * m * (np.abs(raw) < 20), rtol=1e-12, atol=1e-300)


def test_abs_delta_gradient_is_zero_at_delta_zero(x64):
  _, old, adv, m, _ = make_inputs(8)
  sel = np.ones_like(m, bool)

  def total(lp):
    return jnp.where(m > 0, cov.kl_cov_loss(lp, old, adv, m, cov_sel=sel, coef=5.0)[0], 0).sum()

  np.testing.assert_array_equal(np.asarray(jax.grad(total)(old)), -adv * m)


def test_gradients_match_central_differences(x64):
  rng = np.random.default_rng(9)
  m = prefix_mask(rng, 4, 3, np.float64)
  old = -rng.uniform(0.1, 3.0, size=(4, 3))
  logp = old + rng.choice([-1, 1], (4, 3)) * rng.uniform(0.05, 0.6, (4, 3))  # away from kinks
  adv = rng.normal(size=(4, 3)) * m
  u = rng.random((4, 3))
  sel_clip, _ = cov.clip_cov_select(old, adv, m, u, ratio=0.3, lb=-10.0, ub=10.0)
  sel_kl, _ = cov.kl_cov_select(old, adv, m, ratio=0.3)
  fns = {
      "clip_cov": lambda lp: cov.clip_cov_loss(lp, old, adv, m, cov_sel=sel_clip, eps_low=0.7,
                                               eps_high=0.9)[0],
      "kl_cov": lambda lp: cov.kl_cov_loss(lp, old, adv, m, cov_sel=sel_kl, coef=1.0)[0],
  }
  for name, fn in fns.items():
    def total(lp, fn=fn):
      return aggregate("token_mean", fn(lp), m)
    grad = np.asarray(jit(jax.grad(total))(logp))
    total = jit(total)
    np.testing.assert_allclose(grad, central_difference(lambda lp: float(total(lp)), logp),
                               rtol=1e-6, atol=1e-9, err_msg=name)


def test_same_seed_step_minibatch_gives_same_selection(x64):
  _, old, adv, m, _ = make_inputs(11)
  select = jit(lambda u: cov.clip_cov_select(old, adv, m, u, ratio=0.2, lb=0.0, ub=50.0)[0])
  first = np.asarray(select(cov.selection_uniforms(5, 7, 2, (B, T))))
  again = np.asarray(select(cov.selection_uniforms(5, 7, 2, (B, T))))
  np.testing.assert_array_equal(first, again)
  others = [np.asarray(cov.selection_uniforms(*k, (B, T)))
            for k in ((5, 7, 3), (5, 8, 2), (6, 7, 2))]
  base = np.asarray(cov.selection_uniforms(5, 7, 2, (B, T)))
  assert all(not np.array_equal(base, o) for o in others)


def test_float32_paths_run():
  logp, old, adv, m, u = (x.astype(np.float32) for x in make_inputs(12))
  loss, sel, _ = clip_cov_total(logp, old, adv, m, u, 0.2, 0.0, 50.0, 0.2)
  assert np.asarray(loss).dtype == np.float32 and np.asarray(sel).any()
  expected = clip_cov_loss(*(x.astype(np.float64) for x in (logp, old, adv, m, u)), 0.2, 0.2,
                           0.2, 0.0, 50.0)
  np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5, atol=1e-6)


def test_config_errors_name_the_key():
  ones = np.ones((2, 2), np.float32)
  with pytest.raises(ValueError, match="algo.clip_cov_ratio"):
    cov.clip_cov_select(ones, ones, ones, ones, ratio=0.0)
  with pytest.raises(ValueError, match="algo.kl_cov_ratio"):
    cov.kl_cov_select(ones, ones, ones, ratio=1.5)
  with pytest.raises(ValueError, match="algo.clip_cov_lb"):
    cov.clip_cov_select(ones, ones, ones, ones, ratio=0.1, lb=5.0, ub=1.0)


def test_minibatch_selection_is_microbatch_invariant(x64):
  """``sel`` from the whole minibatch, the loss summed over two micro-batches (section 4)."""
  logp, old, adv, m, u = make_inputs(13)
  sel_clip, _ = cov.clip_cov_select(old, adv, m, u, ratio=0.2, lb=0.0, ub=50.0)
  sel_kl, _ = cov.kl_cov_select(old, adv, m, ratio=0.2)
  count = losses.agg_count("token_mean", m)
  for fn, sel in ((lambda *a: cov.clip_cov_loss(*a, eps_low=0.2, eps_high=0.2), sel_clip),
                  (lambda *a: cov.kl_cov_loss(*a, coef=1.0), sel_kl)):
    def part(lp, rows, fn=fn, sel=sel):
      loss, _ = fn(lp, old[rows], adv[rows], m[rows], sel[rows])
      return losses.agg_sum("token_mean", loss, m[rows])

    whole = jit(jax.value_and_grad(lambda lp: part(lp, slice(None)) / count))
    split = jit(jax.value_and_grad(
        lambda lp: (part(lp[:3], slice(0, 3)) + part(lp[3:], slice(3, None))) / count))
    (v1, g1), (v2, g2) = whole(logp), split(logp)
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-12, atol=1e-15)

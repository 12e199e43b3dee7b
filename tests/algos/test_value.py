"""Value loss, explained variance and VAPO's positive-example LM loss (sections 5, 6)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algorithm import resolve
from rljax.algos import value as value_lib

from .helpers import cast, jit, prefix_mask

B, T = 6, 5


def np_value_loss(v, v_old, ret, mask, c):
  """``(token-mean loss, d loss / d V, clip fraction)`` of the clipped value loss."""
  v, v_old, ret = (x.astype(np.float64) for x in (v, v_old, ret))
  valid = mask > 0
  n = valid.sum()
  unclipped = (v - ret) ** 2
  dv_unclipped = 2 * (v - ret)
  if c is None:
    per_token, dv, active = unclipped, dv_unclipped, np.zeros_like(valid)
  else:
    v_clip = np.clip(v, v_old - c, v_old + c)
    clipped = (v_clip - ret) ** 2
    dv_clipped = 2 * (v_clip - ret) * (np.abs(v - v_old) < c)
    active = clipped > unclipped
    per_token = np.maximum(unclipped, clipped)
    dv = np.where(active, dv_clipped, dv_unclipped)
  return ((0.5 * per_token * valid).sum() / n, 0.5 * dv * valid / n,
          (active * valid).sum() / n)


@pytest.mark.parametrize("clip", [0.5, None])
def test_value_loss_value_gradient_clipfrac(prec, clip):
  rng = np.random.default_rng(0)
  mask = prefix_mask(rng, B, T)
  v_old = rng.normal(size=(B, T))
  v = v_old + rng.normal(scale=0.6, size=(B, T))
  ret = rng.normal(size=(B, T))
  v, v_old, ret, mask = cast(prec.dtype, v, v_old, ret, mask)

  @jit
  def f(v):
    def loss(v):
      total, metrics = value_lib.value_loss_sum(v, v_old, ret, mask, clip=clip)
      return total / value_lib.value_loss_count(mask), metrics
    return jax.value_and_grad(loss, has_aux=True)(v)

  (value, metrics), grad = f(v)
  expected, expected_grad, expected_frac = np_value_loss(v, v_old, ret, mask, clip)
  np.testing.assert_allclose(float(value), expected, rtol=prec.rtol)
  np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=prec.rtol, atol=prec.atol)
  s, c = metrics["value_clip_frac"]
  np.testing.assert_allclose(float(s) / float(c), expected_frac, rtol=prec.rtol)
  if clip is not None:
    assert 0 < expected_frac < 1  # both regions exercised


def test_explained_variance(x64):
  rng = np.random.default_rng(1)
  mask = prefix_mask(rng, B, T, np.float64)
  ret = rng.normal(size=(B, T))
  v = ret + rng.normal(scale=0.5, size=(B, T))
  v[mask == 0] = 1e3  # padding ignored
  valid = mask > 0
  expected = 1 - np.var(ret[valid] - v[valid]) / np.var(ret[valid])
  ev = jit(value_lib.explained_variance)
  np.testing.assert_allclose(float(ev(v, ret, mask)), expected, rtol=1e-10)
  assert float(ev(ret, ret, mask)) == 1.0
  assert float(ev(v, np.ones((B, T)), mask)) == 0.0  # Var[ret] = 0: defined as 0, not NaN


def _pos_lm(algo_cfg):
  """The resolved algorithm with VAPO's positive-example LM loss on, and that term."""
  algo_cfg.pos_lm_coef = 0.1
  algo = resolve(algo_cfg)
  term, = [r for r in algo.regularizers if r.name == "pos_lm"]
  assert term.agg == "token_mean" and term.coef == "pos_lm_coef"
  return algo, term


def test_positive_examples_and_lm_loss(prec, algo_cfg):
  algo, term = _pos_lm(algo_cfg)
  rng = np.random.default_rng(2)
  mask = prefix_mask(rng, B, T, prec.dtype)
  logp = -rng.uniform(0.1, 3.0, size=(B, T)).astype(prec.dtype)
  rewards = np.array([1.0, 0.0, 1.0, 0.5, 1.0, 0.0], prec.dtype)


  @jit
  def f(logp, mask, rewards):
    positive = value_lib.positive_example_rows(rewards)
    total, grad = jax.value_and_grad(
        lambda lp: algo.regularizer_sum(term, logp=lp, mask=mask, positive=positive))(logp)
    return positive, total, term.count(mask=mask, positive=positive), grad

  positive, total, count, grad = f(logp, mask, rewards)
  positive = np.asarray(positive)
  np.testing.assert_array_equal(positive, rewards == 1.0)
  sel = (mask > 0) & positive[:, None]
  np.testing.assert_allclose(float(total) / float(count), -logp[sel].astype(np.float64).mean(),
                             rtol=prec.rtol)
  np.testing.assert_array_equal(np.asarray(grad), -sel.astype(prec.dtype))


def test_all_equal_rewards_have_no_positive_example(algo_cfg):
  algo, term = _pos_lm(algo_cfg)

  @jit
  def f(rewards, mask):
    positive = value_lib.positive_example_rows(rewards)
    return (positive.any(),
            algo.regularizer_sum(term, logp=-jnp.ones((4, 3)), mask=mask, positive=positive),
            term.count(mask=mask, positive=positive))

  for rewards in (np.ones(4, np.float32), np.zeros(4, np.float32)):
    assert [float(x) for x in f(rewards, np.ones((4, 3), np.float32))] == [0.0, 0.0, 0.0]


def test_value_clip_fraction_counts_only_clipped_tokens():
  """Issue 13 defect 2: ``old + clip(V - old, -c, c)`` differs from ``V`` by a rounding inside the
  clip range, so ``clipped > unclipped`` counted never-clipped tokens. On a float32 64x64 probe the
  reported fraction must equal the true one, computed in float64 NumPy from the same inputs."""
  rng = np.random.default_rng(13)
  shape, c = (64, 64), 0.5
  v_old = rng.normal(size=shape).astype(np.float32)
  v = (v_old + rng.normal(scale=0.3, size=shape)).astype(np.float32)
  ret = (v + rng.normal(scale=0.3, size=shape)).astype(np.float32)
  mask = np.ones(shape, np.float32)
  v64, old64, ret64 = (x.astype(np.float64) for x in (v, v_old, ret))
  clipped64 = np.clip(v64, old64 - c, old64 + c)
  true_frac = ((clipped64 - ret64) ** 2 > (v64 - ret64) ** 2).mean()
  assert 0.01 < true_frac < 0.2
  with jax.enable_x64(False):
    _, metrics = jit(lambda *a: value_lib.value_loss_sum(*a, clip=c))(v, v_old, ret, mask)
  s, n = metrics["value_clip_frac"]
  assert float(s) / float(n) == true_frac

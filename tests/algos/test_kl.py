"""KL regularisers (ALGORITHMS.md sections 1 and 5) against NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos import kl as kl_lib
from rljax.algorithm import resolve

from .helpers import cast, jit, prefix_mask

ESTIMATORS = ["k1", "k2", "k3", "low_var_kl", "k3+"]


def np_kl(name, logp, ref):
  """``(value, d value / d logp)`` of each estimator (the sheet's formulas)."""
  logp, ref = logp.astype(np.float64), ref.astype(np.float64)
  d = logp - ref
  if name == "k1":
    return d, np.ones_like(d)
  if name == "k2":
    return 0.5 * d ** 2, d
  x_raw = ref - logp
  x = np.clip(x_raw, -20, 20)
  raw_k3 = np.exp(x) - x - 1
  k3 = np.clip(raw_k3, -10, 10)
  if name in ("k3", "low_var_kl"):
    live = (np.abs(x_raw) <= 20) & (raw_k3 <= 10)  # clamps have zero gradient outside
    return k3, np.where(live, 1.0 - np.exp(x), 0.0)
  if name == "k3+":
    return k3, d  # value of k3, gradient of k2
  raise ValueError(name)


def make_pair(seed, dtype, shape=(6, 7)):
  rng = np.random.default_rng(seed)
  logp = -rng.uniform(0.01, 5.0, size=shape)
  gap = rng.normal(scale=0.5, size=shape)
  gap[0, :4] = [25.0, -25.0, 3.0, -4.0]  # beyond the x clamp; k3 above its value clamp
  return cast(dtype, logp, logp + gap)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_value_and_gradient(prec, name):
  logp, ref = make_pair(0, prec.dtype)
  f = jit(lambda lp, rf: (jax.vmap(jax.vmap(jax.value_and_grad(kl_lib.KL_ESTIMATORS.get(name))))(
      lp, rf), kl_lib.kl_estimate(name, lp, rf)))
  (value, grad), dispatched = f(logp, ref)
  expected_value, expected_grad = np_kl(name, logp, ref)
  assert np.asarray(value).dtype == prec.dtype
  np.testing.assert_allclose(np.asarray(value), expected_value, rtol=prec.rtol, atol=prec.atol)
  np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=prec.rtol, atol=prec.atol)
  np.testing.assert_array_equal(np.asarray(dispatched), np.asarray(value))


def test_k3_is_nonnegative_and_k3_plus_is_straight_through():
  logp, ref = make_pair(1, np.float32, shape=(64, 64))

  @jit
  def f(lp, rf):
    g_plus = jax.grad(lambda x: kl_lib.k3_plus(x, rf).sum())(lp)
    g_k2 = jax.grad(lambda x: kl_lib.k2(x, rf).sum())(lp)
    return kl_lib.k3(lp, rf), kl_lib.k3_plus(lp, rf), g_plus, g_k2

  k3, k3_plus, g_plus, g_k2 = (np.asarray(x) for x in f(logp, ref))
  assert np.all(k3 >= 0) and np.all(k3 <= 10)
  np.testing.assert_array_equal(k3_plus, k3)
  np.testing.assert_allclose(g_plus, g_k2, rtol=1e-6)


def test_kl_reward_tokens(prec):
  rng = np.random.default_rng(2)
  mask = prefix_mask(rng, 6, 5, prec.dtype)
  old, ref = make_pair(2, prec.dtype, shape=(6, 5))
  rewards = rng.normal(size=6).astype(prec.dtype)
  beta = 0.05
  kl_reward = lambda r, m, o, rf: kl_lib.kl_reward_tokens(r, m, o, rf, kl_coef=beta,
                                                          estimator="k1")
  out, grad = jit(lambda r, m, o, rf: (kl_reward(r, m, o, rf), jax.grad(
      lambda x: kl_reward(r, m, x, rf).sum())(o)))(rewards, mask, old, ref)
  out = np.asarray(out)
  expected = -beta * (old.astype(np.float64) - ref) * (mask > 0)
  for i in range(6):
    idx = np.flatnonzero(mask[i] > 0)
    if idx.size:
      expected[i, idx[-1]] += rewards[i]
  np.testing.assert_allclose(out, expected, rtol=prec.rtol, atol=prec.atol)
  # a reward, not a loss: no gradient reaches the log-probs
  assert np.all(np.asarray(grad) == 0)


def test_adaptive_kl_controller(x64):
  beta, target, horizon, n = 0.1, 6.0, 10000.0, 256
  kl = np.array([0.0, 3.0, 6.0, 6.6, 7.0, 100.0])
  expected = [beta * (1 + np.clip(k / target - 1, -0.2, 0.2) * n / horizon) for k in kl]
  got = jit(lambda b, k: kl_lib.adaptive_kl_coef(b, k, target=target, horizon=horizon, n=n))(
      beta, kl)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)


def test_ema_reference_over_a_pytree(algo_cfg):
  rng = np.random.default_rng(3)
  ref = {"a": rng.normal(size=(3, 2)).astype(np.float32),
         "b": [rng.normal(size=4).astype(np.float32), jnp.ones(2, jnp.bfloat16)]}
  new = jax.tree.map(lambda x: x + 1, ref)
  out = jit(lambda r, n: kl_lib.ema_update(r, n, 0.9))(ref, new)
  np.testing.assert_allclose(np.asarray(out["a"]), 0.9 * ref["a"] + 0.1 * new["a"], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(out["b"][0]), ref["b"][0] + 0.1, rtol=1e-6)
  assert out["b"][1].dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out["b"][1], np.float32), 1.1, rtol=1e-2)
  algo_cfg.ref_update = "frozen"
  assert resolve(algo_cfg).ref_update(ref, new) is ref
  algo_cfg.ref_update, algo_cfg.ref_ema_decay = "ema", 0.9
  algo = resolve(algo_cfg)
  np.testing.assert_allclose(
      np.asarray(jit(lambda r, n, hp: algo.ref_update(r, n, hp))(ref, new, algo.hparams)["a"]),
      np.asarray(out["a"]), rtol=1e-6)
  algo_cfg.ref_update = "emaa"
  with pytest.raises(ValueError, match="algo.ref_update"):
    resolve(algo_cfg)


@pytest.mark.parametrize("objective,loss_agg,normalize,expected_mode", [
    ("ppo", "seq_mean_token_sum", False, "seq_mean_token_sum"),
    ("ppo", "seq_mean_token_sum", True, "token_mean"),
    ("gspo", "token_mean", False, "seq_mean_token_mean"),
    ("gmpo", "token_mean", False, "seq_mean_token_mean"),
    ("gmpo", "seq_mean_token_sum_norm", True, "token_mean"),
])
def test_kl_in_loss_aggregation(x64, algo_cfg, objective, loss_agg, normalize, expected_mode):
  """KL follows the policy loss's aggregation; with T1 normalisation a per-valid-token mean."""
  algo_cfg.policy_loss, algo_cfg.loss_agg, algo_cfg.kl_normalize = objective, loss_agg, normalize
  algo_cfg.kl_estimator = "k3"
  algo = resolve(algo_cfg)
  kl_term, = [r for r in algo.regularizers if r.name == "kl"]
  assert kl_term.agg == expected_mode and kl_term.coef == "kl_coef"
  rng = np.random.default_rng(4)
  mask = prefix_mask(rng, 6, 5, np.float64)
  logp, ref = make_pair(4, np.float64, shape=(6, 5))
  total, count = jit(lambda lp, rf, m: (
      algo.regularizer_sum(kl_term, logp=lp, ref_logp=rf, mask=m),
      kl_term.count(mask=m)))(logp, ref, mask)
  k, _ = np_kl("k3", logp, ref)
  valid = mask > 0
  rows = valid.any(1)
  per_row_sum = (k * valid).sum(1)
  expected = {
      "token_mean": per_row_sum.sum() / valid.sum(),
      "seq_mean_token_mean": (per_row_sum[rows] / valid.sum(1)[rows]).mean(),
      "seq_mean_token_sum": per_row_sum[rows].mean(),
      "seq_mean_token_sum_norm": per_row_sum[rows].mean() / mask.shape[1],
  }[expected_mode]
  np.testing.assert_allclose(float(total) / float(count), expected, rtol=1e-10)


def test_placement_and_estimator_names_are_checked(algo_cfg):
  algo_cfg.kl_placement = "none"
  algo = resolve(algo_cfg)
  assert algo.kl_placement is None and "kl" not in [r.name for r in algo.regularizers]
  algo_cfg.kl_placement = "reward"
  algo = resolve(algo_cfg)
  assert algo.kl_placement == "reward" and "kl" not in [r.name for r in algo.regularizers]
  algo_cfg.kl_estimator = "k4"
  with pytest.raises(KeyError, match="algo.kl_estimator.*k1, k2, k3, k3\\+, low_var_kl"):
    resolve(algo_cfg)
  algo_cfg.kl_placement = "none"  # a misspelt name is an error even where the KL is off
  with pytest.raises(KeyError, match="algo.kl_estimator"):
    resolve(algo_cfg)
  algo_cfg.kl_estimator, algo_cfg.kl_placement = "k3", "both"
  with pytest.raises(ValueError, match="algo.kl_placement"):
    resolve(algo_cfg)

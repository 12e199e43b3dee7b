"""Loss aggregation (ALGORITHMS.md section 4): definitions and micro-batch invariance."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos import kl as kl_lib
from rljax.algorithm import resolve
from rljax.algos import losses

from .helpers import cast, jit, log_ratios, prefix_mask

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
B, T, D = 8, 5, 3


def aggregate(mode, values, mask, norm_constant=None):
  """The aggregate over one whole minibatch, ``agg_sum / agg_count`` (the library's two halves)."""
  return losses.safe_mean(losses.agg_sum(mode, values, mask, norm_constant),
                          losses.agg_count(mode, mask))


def np_aggregate(mode, values, mask, norm_constant=None):
  """The sheet's definitions, literally; rows without a valid token excluded from sequence means."""
  values = values.astype(np.float64)
  valid = mask > 0
  rows = [i for i in range(len(mask)) if valid[i].any()]
  if mode == "token_mean":
    return values[valid].sum() / valid.sum()
  if mode == "seq_mean_token_mean":
    return np.mean([values[i][valid[i]].sum() / valid[i].sum() for i in rows])
  if mode == "seq_mean_token_sum":
    return np.mean([values[i][valid[i]].sum() for i in rows])
  c = mask.shape[1] if norm_constant is None else norm_constant
  return np.mean([values[i][valid[i]].sum() / c for i in rows])


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_matches_definition(prec, mode):
  rng = np.random.default_rng(0)
  mask = prefix_mask(rng, B, T)
  values = rng.normal(size=(B, T)) * 10
  values[mask == 0] = 1e6  # padding must not leak in
  values, mask = cast(prec.dtype, values, mask)
  f = jit(lambda v, m: [(losses.agg_sum(mode, v, m, c), losses.agg_count(mode, m),
                          aggregate(mode, v, m, c)) for c in (None, 3.0)])
  # The means are sums with cancellation (about 0.004 from terms of about 10): their error is
  # relative to the terms, not to the result, and depends on the summation order (GPU reductions
  # are ordered differently from NumPy's).
  atol = prec.atol * np.abs(values[mask > 0]).max()
  for c, (total, count, mean) in zip((None, 3.0), f(values, mask)):
    expected = np_aggregate(mode, values, mask, c)
    np.testing.assert_allclose(float(total) / float(count), expected, rtol=prec.rtol, atol=atol)
    np.testing.assert_allclose(float(mean), expected, rtol=prec.rtol, atol=atol)


def test_empty_minibatch_aggregates_to_zero():
  out = jit(lambda v, m: [(aggregate(mode, v, m), losses.agg_count(mode, m))
                          for mode in MODES])(jnp.ones((2, 3)), jnp.zeros((2, 3)))
  assert all(float(mean) == 0.0 and float(count) == 0.0 for mean, count in out)


def test_unknown_mode_lists_names():
  with pytest.raises(KeyError, match="algo.loss_agg.*seq_mean_token_sum_norm, sequence_mean, token_mean"):
    losses.agg_count("mean", jnp.ones((2, 3)))


# --- micro-batch invariance with a tiny linear policy --------------------------------------------

# Every aggregation (through PPO) and both forced ones; KL in loss with and without T1
# normalisation. Other per-token objectives aggregate through the same code as PPO.
INVARIANCE_CASES = [("ppo", "token_mean", False), ("ppo", "seq_mean_token_mean", True),
                    ("ppo", "seq_mean_token_sum", False), ("ppo", "seq_mean_token_sum_norm", True),
                    ("gspo", "token_mean", False), ("gmpo", "token_mean", True)]


@pytest.mark.parametrize("objective,mode,kl_normalize", INVARIANCE_CASES)
def test_microbatch_split_gives_same_loss_and_gradient(x64, algo_cfg, objective, mode,
                                                       kl_normalize):
  """Split a minibatch by rows into 1, 2, 4 micro-batches; sum each part's ``sum`` and divide by
  the whole minibatch's count: loss and parameter gradient are the same (policy loss + KL)."""
  algo_cfg.policy_loss, algo_cfg.loss_agg = objective, mode
  algo_cfg.kl_estimator, algo_cfg.kl_normalize = "k3", kl_normalize
  algo_cfg.loss_norm_constant = None
  rng = np.random.default_rng(1)
  mask = prefix_mask(rng, B, T, np.float64)
  # A linear Bernoulli policy: logp[i, t] = log sigmoid(x[i, t] . w), a parameter gradient
  # through every token.
  feats = rng.normal(size=(B, T, D))
  weights = rng.normal(size=(D,))
  logp0 = -np.logaddexp(0.0, -feats @ weights)
  old = logp0 - 0.5 * log_ratios(rng, (B, T)) * (rng.random((B, T)) < 0.5)
  ref = logp0 + rng.normal(scale=0.3, size=(B, T))
  adv = np.repeat(rng.normal(size=(B, 1)), T, 1) * mask
  perm = rng.permutation(B)
  beta = 0.1
  data = tuple(jnp.asarray(a) for a in (feats, old, ref, adv, mask))

  algo = resolve(algo_cfg)
  kl_term, = [r for r in algo.regularizers if r.name == "kl"]

  def part_loss(w, feats, old, ref, adv, mask, pl_count, kl_count):
    lp = jax.nn.log_sigmoid(feats @ w)
    pl, _ = algo.policy_loss_sum(logp=lp, old_logp=old, advantages=adv, mask=mask)
    kl = algo.regularizer_sum(kl_term, logp=lp, ref_logp=ref, mask=mask)
    return pl / pl_count + beta * kl / kl_count

  @jit
  def part(w, data, whole_mask):
    """One micro-batch: (its loss share and gradient, its own counts); compiled per part size."""
    pl_count = algo.policy_loss_count(whole_mask)
    kl_count = kl_term.count(mask=whole_mask)
    v, g = jax.value_and_grad(part_loss)(w, *data, pl_count, kl_count)
    return v, g, algo.policy_loss_count(data[-1]), kl_term.count(mask=data[-1])

  def all_splits(w, data):
    out = []
    for k in (1, 2, 4):
      parts = [part(w, tuple(x[rows] for x in data), data[-1])
               for rows in np.array_split(perm, k)]
      out.append(tuple(sum(p[j] for p in parts) for j in range(4)))
    return out

  results = all_splits(jnp.asarray(weights), data)
  v1, g1, pc1, kc1 = results[0]
  assert np.isfinite(float(v1)) and np.abs(np.asarray(g1)).max() > 0
  for v, g, pc, kc in results[1:]:
    np.testing.assert_allclose(float(v), float(v1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g1), rtol=1e-6,
                               atol=1e-9 * np.abs(np.asarray(g1)).max())
    # Counts add up over parts too (what a cross-device psum of counts relies on).
    assert float(pc) == float(pc1) and float(kc) == float(kc1)

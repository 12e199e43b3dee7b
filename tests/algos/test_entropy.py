"""80/20 entropy mask (ALGORITHMS.md 8.4) and the adaptive entropy coefficient (8.7)."""
import jax
import numpy as np
import pytest

from rljax.algos import entropy, losses

from .helpers import jit, log_ratios, prefix_mask

B, T = 8, 6


# --- the sheet's NumPy references (float64) ------------------------------------------------------

def entropy_keep(H, m, rho):
    if rho >= 1.0: return m > 0
    pool = H[m > 0]
    if pool.size == 0: return np.zeros(m.shape, bool)
    return (m > 0) & (H >= np.quantile(pool, 1.0 - rho))     # method='linear'; ties kept


def entropy_ctrl_step(c, e, target, delta, c_min, c_max, strict=True):
    low = e < target if strict else e <= target
    c = float(np.clip(c + delta if low else c - delta, c_min, c_max))
    return c, c * float(low)                 # (new state, coefficient applied at the next step)


class SkyworkEntController:
  """Skywork-OR1@64e96afa ``core_algos.EntController`` re-stated: ``value`` starts at the initial
  coefficient and ``entropy_loss_enabled`` at 1; ``update(e)`` steps ``value`` by +-delta (up when
  ``e < target``), clips it to [min, max] and sets ``enabled = int(e < target)``. The bonus applied
  in a step is ``value * enabled``."""

  def __init__(self, init, max_value, min_value, delta, target):
    self.value, self.max_value, self.min_value = init, max_value, min_value
    self.delta, self.target, self.enabled = delta, target, 1

  def update(self, e):
    self.value = self.value + self.delta if e < self.target else self.value - self.delta
    self.value = float(np.clip(self.value, self.min_value, self.max_value))
    self.enabled = int(e < self.target)

  @property
  def applied(self):
    return self.value * self.enabled


def make_entropy(seed):
  rng = np.random.default_rng(seed)
  m = prefix_mask(rng, B, T, np.float64)
  H = rng.gamma(2.0, 0.5, size=(B, T))
  H[rng.random((B, T)) < 0.3] = 0.5  # many ties, some at the threshold
  return H, m


keep_fn = jit(entropy.entropy_keep_mask, static_argnames="rho")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_keep_mask_matches_reference(x64, seed):
  H, m = make_entropy(seed)
  for rho in (0.0, 0.05, 0.2, 0.5, 0.8, 0.99, 1.0, 3.0):
    keep, metrics = keep_fn(H, m, rho=rho)
    want = entropy_keep(H, m, rho)
    np.testing.assert_array_equal(np.asarray(keep), want, err_msg=f"rho={rho}")
    if rho < 1:
      np.testing.assert_allclose(float(metrics["entropy_mask/tau"][0]),
                                 np.quantile(H[m > 0], 1 - rho), rtol=1e-12)
    n = m.sum()
    np.testing.assert_allclose(float(metrics["entropy_mask/kept_frac"][0]) / n, want.sum() / n)
    np.testing.assert_allclose(float(metrics["entropy_mask/H_kept_mean"][0]) /
                               float(metrics["entropy_mask/H_kept_mean"][1]), H[want].mean(),
                               rtol=1e-12)
    np.testing.assert_allclose(float(metrics["entropy_mask/H_mean"][0]) / n, H[m > 0].mean(),
                               rtol=1e-12)


def test_masked_quantile_matches_numpy_linear(x64):
  rng = np.random.default_rng(3)
  for n_valid in (1, 2, 3, 7, 30):
    x = rng.normal(size=(5, 6))
    m = np.zeros(30)
    m[rng.permutation(30)[:n_valid]] = 1
    m = m.reshape(5, 6)
    for q in (0.0, 0.1, 0.25, 0.5, 0.8, 0.999, 1.0):
      np.testing.assert_allclose(float(entropy.masked_quantile(x, m, q)),
                                 np.quantile(x[m > 0], q), rtol=1e-14, atol=1e-15)


def test_rho_one_is_identity_and_rho_zero_keeps_only_the_maximum(x64):
  H, m = make_entropy(4)
  keep, _ = keep_fn(H, m, rho=1.0)
  np.testing.assert_array_equal(np.asarray(keep), m > 0)
  H = np.where(m > 0, H, 99.0)  # padding is not in the pool, even above the maximum
  top = H[m > 0].max()
  H[np.nonzero(m)[0][0], 0] = top  # a tie at the maximum
  keep, _ = keep_fn(H, m, rho=0.0)
  np.testing.assert_array_equal(np.asarray(keep), (m > 0) & (H == top))
  assert np.asarray(keep).sum() >= 2


def test_ties_at_the_threshold_are_kept(x64):
  H = np.array([[0.1, 0.5, 0.5, 0.5, 0.9]])
  m = np.ones_like(H)
  keep, _ = keep_fn(H, m, rho=0.2)  # tau = quantile 0.8 = 0.58: only 0.9
  np.testing.assert_array_equal(np.asarray(keep), [[0, 0, 0, 0, 1]])
  keep, _ = keep_fn(H, m, rho=0.4)  # tau = quantile 0.6 = 0.5: all three ties kept
  np.testing.assert_array_equal(np.asarray(keep), [[0, 1, 1, 1, 1]])


def test_empty_pool_keeps_nothing(x64):
  H, m = make_entropy(5)
  keep, metrics = keep_fn(H, np.zeros_like(m), rho=0.2)
  assert not np.asarray(keep).any()
  assert all(np.isfinite(float(s)) for s, _ in metrics.values())


def test_old_source_mask_is_microbatch_invariant(x64):
  """The keep mask from ``H_old`` over the whole minibatch, applied to a ``token_mean`` PPO loss
  summed over two micro-batches, gives the whole-minibatch loss and gradient (section 4)."""
  rng = np.random.default_rng(6)
  H_old, m = make_entropy(6)
  old = -rng.uniform(0.01, 5.0, size=(B, T))
  logp = old + log_ratios(rng, (B, T))
  adv = rng.normal(size=(B, T)) * m
  keep, _ = entropy.entropy_keep_mask(H_old, m, rho=0.3)
  count = losses.agg_count("token_mean", m)

  def part_sum(lp, rows):
    loss, _ = losses.ppo_loss(lp, old[rows], adv[rows], m[rows], eps_low=0.2, eps_high=0.28)
    return losses.agg_sum("token_mean", loss * keep[rows], m[rows])

  def whole(lp):
    return part_sum(lp, slice(None)) / count

  def split(lp):
    return (part_sum(lp[:3], slice(0, 3)) + part_sum(lp[3:], slice(3, None))) / count

  v1, g1 = jit(jax.value_and_grad(whole))(logp)
  v2, g2 = jit(jax.value_and_grad(split))(logp)
  np.testing.assert_allclose(float(v1), float(v2), rtol=1e-12)
  np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-12, atol=1e-15)
  assert np.asarray(g1)[np.asarray(~keep) & (m > 0)].max() == 0  # masked tokens get no gradient


def test_bad_rho_names_the_key():
  with pytest.raises(ValueError, match="algo.entropy_top_rho"):
    entropy.entropy_keep_mask(np.ones((2, 2)), np.ones((2, 2)), rho=-0.1)


# --- adaptive entropy coefficient ----------------------------------------------------------------

SKYWORK = dict(target=0.2, delta=1e-4, coef_min=0.0, coef_max=0.005)


step = jit(lambda s, e: entropy.entropy_ctrl_step(s, e, **SKYWORK))


def test_controller_reproduces_entcontroller(x64):
  rng = np.random.default_rng(7)
  # A scripted entropy trace: collapse below the target, recovery above it, values at the target.
  trace = np.concatenate([np.linspace(0.6, 0.05, 150), rng.uniform(0.1, 0.3, 200),
                          np.full(20, 0.2), np.linspace(0.05, 0.5, 130)])
  for c0 in (0.0, 0.001, 0.004):
    ref = SkyworkEntController(c0, SKYWORK["coef_max"], SKYWORK["coef_min"], SKYWORK["delta"],
                               SKYWORK["target"])
    state = entropy.entropy_ctrl_init(c0)
    assert float(state.applied) == ref.applied == c0  # alpha_0 = c_0
    sheet_c = c0
    for e in trace:
      ref.update(float(e))
      state = step(state, e)
      sheet_c, sheet_alpha = entropy_ctrl_step(sheet_c, float(e), SKYWORK["target"],
                                               SKYWORK["delta"], SKYWORK["coef_min"],
                                               SKYWORK["coef_max"])
      np.testing.assert_allclose([float(state.coef), float(state.applied)],
                                 [ref.value, ref.applied], rtol=1e-12, atol=1e-15)
      assert (sheet_c, sheet_alpha) == pytest.approx((ref.value, ref.applied), abs=1e-15)
      assert float(state.measured) == e
    assert ref.value == SKYWORK["coef_min"]  # the trace ends above the target: decayed to c_min


def test_controller_non_strict_is_trl_and_respects_bounds(x64):
  state = entropy.entropy_ctrl_init(0.5)
  strict = entropy.entropy_ctrl_step(state, 0.2, **SKYWORK)
  trl = entropy.entropy_ctrl_step(state, 0.2, **SKYWORK, strict=False)
  assert float(strict.applied) == 0.0 and float(strict.coef) == 0.005  # clipped to c_max
  assert float(trl.applied) == float(trl.coef) == 0.005
  with pytest.raises(ValueError, match="algo.entropy_coef_min"):
    entropy.entropy_ctrl_step(state, 0.1, target=0.2, delta=1e-4, coef_min=1.0, coef_max=0.0)


def test_controller_state_survives_a_checkpoint_round_trip(tmp_path):
  from rljax.runs.checkpoint import Checkpointer
  state = entropy.entropy_ctrl_init(0.001)
  fresh = {"ent_ctrl": state}
  state = entropy.entropy_ctrl_step(state, 0.15, **SKYWORK)
  with Checkpointer(tmp_path / "ckpt", keep=1, async_save=False) as ckpt:
    ckpt.save(3, {"ent_ctrl": state}, {})
    restored, _ = ckpt.restore(None, fresh)
  restored = restored["ent_ctrl"]
  assert isinstance(restored, entropy.EntropyCtrlState)
  for got, want in zip(restored, state):
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_sampled_entropy_is_minus_token_mean_old_logp(x64):
  rng = np.random.default_rng(8)
  m = prefix_mask(rng, B, T, np.float64)
  old = -rng.uniform(0.01, 5.0, size=(B, T))
  s, n = entropy.sampled_entropy(old, m)
  np.testing.assert_allclose(float(s) / float(n), -old[m > 0].mean(), rtol=1e-12)

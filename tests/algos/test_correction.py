"""Rollout correction (ALGORITHMS.md 8.2): weights, rejection and metrics vs the sheet's NumPy."""
import numpy as np
import pytest

from rljax.algos import correction, losses

from .helpers import jit, prefix_mask

B, T = 8, 5


def aggregate(mode, values, mask):
  """The aggregate of one whole minibatch, ``agg_sum / agg_count`` (section 4)."""
  return losses.agg_sum(mode, values, mask) / losses.agg_count(mode, mask)


# --- the sheet's NumPy reference (float64) -------------------------------------------------------

def ratios(old_logp, sampler_logp, m, level):
    d = (old_logp - sampler_logp) * m
    x = {"token": d, "sequence": d.sum(1, keepdims=True),
         "geometric": d.sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1)}[level]
    return np.broadcast_to(np.exp(np.clip(x, -20, 20)), m.shape)
def is_weights(old_logp, sampler_logp, m, level, cap, floor=None, batch_norm=False):
    w = np.minimum(ratios(old_logp, sampler_logp, m, level), cap)
    w = (w if floor is None else np.maximum(w, floor)) * m
    if batch_norm:
        v = m.sum(1) > 0
        mu = w.sum() / m.sum() if level == "token" else (w.sum(1)[v] / m.sum(1)[v]).mean()
        w = w / mu if mu > 1e-8 else w
    return w
def masked_is_weights(old_logp, sampler_logp, m, level, cap, floor=None, batch_norm=False):
    """AReaL's capped weight: a ratio above the cap gets weight 0; the token stays in ``m``."""
    rho = ratios(old_logp, sampler_logp, m, level)
    w = np.where(rho <= cap, rho if floor is None else np.maximum(rho, floor), 0.0) * m
    if batch_norm:
        v = m.sum(1) > 0
        mu = w.sum() / m.sum() if level == "token" else (w.sum(1)[v] / m.sum(1)[v]).mean()
        w = w / mu if mu > 1e-8 else w
    return w
def reject(old_logp, sampler_logp, m, level=None, lo=0.0, hi=np.inf, veto=None, k3=None):
    keep = np.ones(m.shape, bool); dl = np.clip(old_logp - sampler_logp, -20, 20)
    if level is not None:
        rho = ratios(old_logp, sampler_logp, m, level); keep &= (rho >= lo) & (rho <= hi)
    if veto is not None: keep &= ~((dl < np.log(veto)) & (m > 0)).any(1, keepdims=True)
    if k3 is not None:
        k = ((np.exp(dl) - 1 - dl) * m).sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1)
        keep &= k <= k3
    return m * keep                                                   # the new m


def np_mismatch(old, sampler, m):
  """The ``mismatch/`` table, written from its definitions."""
  v = m > 0
  rows = v.any(1)
  n = np.maximum(v.sum(1), 1)
  rm = lambda x: x[rows].mean()
  row_old, row_s = (old * v).sum(1) / n, (sampler * v).sum(1) / n
  dl = np.clip(old - sampler, -20, 20)
  rho = np.exp(dl)
  seq = np.clip(((old - sampler) * v).sum(1), -20, 20)
  return {
      "mismatch/k1": (sampler - old)[v].mean(), "mismatch/k3": (rho - 1 - dl)[v].mean(),
      "mismatch/abs_diff_mean": np.abs(old - sampler)[v].mean(),
      "mismatch/abs_diff_max": np.abs(old - sampler)[v].max(),
      "mismatch/train_ppl": rm(np.exp(-row_old)), "mismatch/sampler_ppl": rm(np.exp(-row_s)),
      "mismatch/log_ppl_diff": rm(row_s - row_old),
      "mismatch/ppl_ratio": rm(np.exp(row_s - row_old)),
      "mismatch/chi2_token": (rho ** 2)[v].mean() - 1, "mismatch/chi2_seq": rm(np.exp(2 * seq)) - 1,
  }


def make_inputs(seed, extreme=True):
  rng = np.random.default_rng(seed)
  m = prefix_mask(rng, B, T, np.float64)
  old = -rng.uniform(0.01, 5.0, size=(B, T))
  gap = rng.normal(scale=0.3, size=(B, T))
  if extreme:
    pick = rng.random((B, T))
    gap = np.where(pick < 0.1, rng.uniform(3, 8, (B, T)) * rng.choice([-1, 1], (B, T)), gap)
    gap = np.where(pick > 0.95, rng.uniform(21, 30, (B, T)) * rng.choice([-1, 1], (B, T)), gap)
  return old, old - gap, m


LEVELS = ("token", "sequence", "geometric")


@pytest.mark.parametrize("level", LEVELS)
def test_weights_match_reference(x64, level):
  old, sampler, m = make_inputs(LEVELS.index(level))
  for cap, floor, norm in ((2.0, None, False), (5.0, 0.5, True), (2.0, 0.9, False)):
    w, _ = correction.rollout_is_weights(old, sampler, m, level=level, cap=cap, floor=floor,
                                         batch_norm=norm)
    np.testing.assert_allclose(np.asarray(w), is_weights(old, sampler, m, level, cap, floor, norm),
                               rtol=1e-6, atol=1e-12, err_msg=f"{cap} {floor} {norm}")


@pytest.mark.parametrize("level", LEVELS)
def test_is_metrics(x64, level):
  old, sampler, m = make_inputs(10 + LEVELS.index(level))
  cap = 2.0
  _, metrics = correction.rollout_is_weights(old, sampler, m, level=level, cap=cap,
                                             batch_norm=True)
  rho = ratios(old, sampler, m, level)
  v = m > 0
  unit = rho[v] if level == "token" else rho[:, 0][v.any(1)]
  wp = np.clip(rho, 1 / cap, cap)[v]
  w = is_weights(old, sampler, m, level, cap)
  mu = w.sum() / m.sum() if level == "token" else (w.sum(1)[v.any(1)] / m.sum(1)[v.any(1)]).mean()
  expected = {"rollout_is/mean": unit.mean(), "rollout_is/min": unit.min(),
              "rollout_is/max": unit.max(), "rollout_is/frac_high": (unit > cap).mean(),
              "rollout_is/frac_low": (unit < 1 / cap).mean(),
              "rollout_is/ess": 1 / ((wp / wp.mean()) ** 2).mean(),
              "rollout_is/batch_norm_factor": mu}
  assert set(metrics) == set(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(float(metrics[key]), value, rtol=1e-6, err_msg=key)


REJECT_CASES = [
    dict(level="token", lo=0.5, hi=2.0), dict(level="sequence", lo=0.5, hi=2.0),
    dict(level="geometric", lo=0.999, hi=1.001), dict(level="geometric", lo=0.8, hi=1.5, veto=1e-4),
    dict(veto=0.9), dict(k3=0.01), dict(level="token", lo=0.0, hi=3.0, veto=0.1, k3=0.5),
]


@pytest.mark.parametrize("case", range(len(REJECT_CASES)))
def test_rejection_matches_reference_and_leaves_counts(x64, case):
  kwargs = REJECT_CASES[case]
  old, sampler, m = make_inputs(20 + case)
  new_m, metrics = jit(lambda *a: correction.rollout_rejection_mask(*a, **kwargs))(old, sampler, m)
  expected = reject(old, sampler, m, **kwargs)
  np.testing.assert_array_equal(np.asarray(new_m), expected)
  v, kept = m > 0, expected > 0
  assert 0 < kept.sum() < v.sum() or case == 2  # most cases reject some, keep some
  # Rejected entries leave every count.
  for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
    rows = kept.any(1)
    want = kept.sum() if mode == "token_mean" else rows.sum()
    assert float(losses.agg_count(mode, new_m)) == want
  rejected = v & ~kept
  np.testing.assert_allclose(float(metrics["rollout_rs/token_frac"]), rejected.sum() / v.sum())
  np.testing.assert_allclose(float(metrics["rollout_rs/seq_frac"]),
                             rejected.any(1)[v.any(1)].mean())


def test_token_level_with_cap_is_the_old_tis_cap(x64):
  old, sampler, m = make_inputs(30)
  for cap in (1.5, 2.0, 10.0):
    w, _ = correction.rollout_is_weights(old, sampler, m, level="token", cap=cap)
    tis = losses.truncated_is_weights(old, sampler, cap)
    np.testing.assert_array_equal(np.asarray(w), np.asarray(tis) * m)


def test_length_one_rows_sequence_equals_token(x64):
  old, sampler, m = make_inputs(31)
  m = np.zeros_like(m)
  m[:, 0] = 1.0
  m[2] = 0.0  # an empty row too
  for kwargs in (dict(cap=2.0), dict(cap=3.0, floor=0.5, batch_norm=True)):
    wt, _ = correction.rollout_is_weights(old, sampler, m, level="token", **kwargs)
    for level in ("sequence", "geometric"):
      ws, _ = correction.rollout_is_weights(old, sampler, m, level=level, **kwargs)
      np.testing.assert_allclose(np.asarray(ws), np.asarray(wt), rtol=1e-12)
  mt, _ = correction.rollout_rejection_mask(old, sampler, m, level="token", lo=0.5, hi=2.0)
  ms, _ = correction.rollout_rejection_mask(old, sampler, m, level="sequence", lo=0.5, hi=2.0)
  np.testing.assert_array_equal(np.asarray(mt), np.asarray(ms))


def test_trl_mask_mode_differs_by_valid_over_kept(x64):
  """TRL's ``token_mask`` zeroes the weight and keeps the token in the denominator; rljax
  rejects it."""
  old, sampler, m = make_inputs(32, extreme=False)
  sampler = sampler + np.random.default_rng(32).normal(scale=0.5, size=(B, T))
  loss = np.random.default_rng(33).normal(size=(B, T))
  c_min, c_max = 0.5, 2.0
  rho = ratios(old, sampler, m, "token")
  trl_w = rho * ((rho >= c_min) & (rho <= c_max)) * m
  trl = aggregate("token_mean", trl_w * loss, m)
  new_m, _ = correction.rollout_rejection_mask(old, sampler, m, level="token", lo=c_min, hi=c_max)
  w, _ = correction.rollout_is_weights(old, sampler, new_m, level="token", cap=c_max)
  ours = aggregate("token_mean", w * loss, new_m)
  n_valid, n_kept = m.sum(), np.asarray(new_m).sum()
  assert n_kept < n_valid
  np.testing.assert_allclose(float(ours), float(trl) * n_valid / n_kept, rtol=1e-12)


def test_mismatch_metrics(x64):
  old, sampler, m = make_inputs(40)
  metrics = jit(correction.mismatch_metrics)(old, sampler, m)
  expected = np_mismatch(old, sampler, m)
  assert set(metrics) == set(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(float(metrics[key]), value, rtol=1e-6, err_msg=key)


def test_float32_weights_and_empty_batch():
  old, sampler, m = (x.astype(np.float32) for x in make_inputs(41))
  w, _ = correction.rollout_is_weights(old, sampler, m, level="sequence", cap=2.0)
  assert np.asarray(w).dtype == np.float32
  old64, sampler64, m64 = (x.astype(np.float64) for x in (old, sampler, m))
  np.testing.assert_allclose(np.asarray(w), is_weights(old64, sampler64, m64, "sequence", 2.0),
                             rtol=1e-5)
  empty = np.zeros_like(m)
  w, is_m = correction.rollout_is_weights(old, sampler, empty, level="token", cap=2.0,
                                          batch_norm=True)
  _, rs_m = correction.rollout_rejection_mask(old, sampler, empty, level="token", lo=0.5, hi=2.0)
  mm = correction.mismatch_metrics(old, sampler, empty)
  for value in (*is_m.values(), *rs_m.values(), *mm.values()):
    assert np.isfinite(float(value))
  assert float(np.asarray(w).sum()) == 0.0


def test_config_errors_name_the_key():
  ones = np.ones((2, 2), np.float32)
  with pytest.raises(ValueError, match="algo.rollout_is must be one of"):
    correction.rollout_is_weights(ones, ones, ones, level="seq", cap=2.0)
  with pytest.raises(ValueError, match="algo.rollout_rs must be one of"):
    correction.rollout_rejection_mask(ones, ones, ones, level="tok", lo=0.0, hi=2.0)
  with pytest.raises(ValueError, match="algo.rollout_rs_hi"):
    correction.rollout_rejection_mask(ones, ones, ones, level="token", lo=0.0, hi=None)
  with pytest.raises(ValueError, match="algo.rollout_is_cap"):
    correction.rollout_is_weights(ones, ones, ones, level="token", cap=0.0)
  with pytest.raises(ValueError, match="algo.rollout_rs_veto"):
    correction.rollout_rejection_mask(ones, ones, ones, veto=0.0)


def test_row_levels_with_holes_in_the_mask(x64):
  old, sampler, m = make_inputs(50)
  m[1] = [0, 1, 1, 0, 1]  # the first token of the row is not valid
  for level in ("sequence", "geometric"):
    w, metrics = correction.rollout_is_weights(old, sampler, m, level=level, cap=2.0,
                                               batch_norm=True)
    np.testing.assert_allclose(np.asarray(w), is_weights(old, sampler, m, level, 2.0, None, True),
                               rtol=1e-12)
    rho = ratios(old, sampler, m, level)[:, 0][(m > 0).any(1)]
    np.testing.assert_allclose(float(metrics["rollout_is/mean"]), rho.mean(), rtol=1e-12)


# --- what happens above the cap: truncation (TIS) or AReaL's mask ------------------------------

@pytest.mark.parametrize("level", LEVELS)
def test_masked_weights_match_reference(x64, level):
  old, sampler, m = make_inputs(60 + LEVELS.index(level))
  for cap, floor, norm in ((2.0, None, False), (5.0, 0.5, True), (1.5, 0.9, False)):
    rho = ratios(old, sampler, m, level)
    assert ((rho > cap) & (m > 0)).any()  # some weights are above the cap
    w, metrics = correction.rollout_is_weights(old, sampler, m, level=level, cap=cap,
                                               floor=floor, batch_norm=norm, over_cap="mask")
    expected = masked_is_weights(old, sampler, m, level, cap, floor, norm)
    np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-6, atol=1e-12,
                               err_msg=f"{cap} {floor} {norm}")
    assert (np.asarray(w)[(rho > cap) & (m > 0)] == 0).all()
    truncated, _ = correction.rollout_is_weights(old, sampler, m, level=level, cap=cap,
                                                 floor=floor, batch_norm=norm)
    assert not np.allclose(np.asarray(truncated), expected)


def areal_decoupled_loss(logp, prox_logp, behav_logp, A, m, eps_low, eps_high, cap):
    """AReaL's ``ppo_actor_loss_fn`` (token level, decoupled, ``behav_imp_weight_cap``), in NumPy:
    the PPO clip on ``logp - prox_logp``, times the behaviour weight ``exp(prox - behav)``, which
    is 0 where it exceeds the cap; the sum is divided by every loss-mask token."""
    r = np.exp(logp - prox_logp)
    pg = np.maximum(-A * r, -A * np.clip(r, 1 - eps_low, 1 + eps_high))
    w = np.exp(prox_logp - behav_logp)
    w = np.where((w <= cap) & (m > 0), w, 0.0)
    return (pg * w * m).sum() / max(m.sum(), 1)


def test_mask_mode_is_areals_decoupled_objective(x64):
  """The rollout-correction transform with ``rollout_is_over_cap='mask'`` and ``token_mean``
  computes AReaL's decoupled loss (sampler = behaviour, ``old_logp`` = proximal policy); the
  masked tokens stay in the denominator, and truncation gives another loss."""
  from configs.base import get_config
  from rljax.algorithm import resolve
  from rljax.rollout.record import Rollout
  from rljax.transforms import Scored
  old, sampler, m = make_inputs(70, extreme=False)
  rng = np.random.default_rng(71)
  sampler = sampler + rng.normal(scale=0.6, size=(B, T))  # stale: some ratios above the cap
  logp = old + rng.normal(scale=0.3, size=(B, T))
  adv = rng.normal(size=(B, T)) * m
  cap, eps_low, eps_high = 1.5, 0.2, 0.28
  assert ((np.exp(old - sampler) > cap) & (m > 0)).sum() >= 3
  losses_by_mode = {}
  for over_cap in ("mask", "truncate"):
    algo_settings = get_config().algo.to_dict()
    algo_settings.update(kl_placement="none", policy_loss="ppo", loss_agg="token_mean",
                         clip_eps_low=eps_low, clip_eps_high=eps_high, rollout_is="token",
                         rollout_is_cap=cap, rollout_is_over_cap=over_cap)
    algo = resolve(algo_settings, group_size=2, critic=False)
    transform = algo.transform("rollout_correction")
    assert "rollout_is_over_cap" in transform.keys
    rollout = Rollout(prompt_tokens=None, prompt_mask=None, tokens=None, mask=m,
                      sampler_logp=sampler, draw_logp=None, lengths=None, truncated=None,
                      rewards=None, extras={})
    view = Scored(rollout=rollout, hp=algo.hparams, group_size=2, mask=m, loss_mask=m,
                  advantages=adv, old_logp=old, entropy=None, aux_logp=None)
    changes, _ = transform.on_score(view)
    np.testing.assert_array_equal(np.asarray(changes["loss_mask"]), m)  # nothing rejected
    total, _ = algo.policy_loss_sum(logp=logp, old_logp=old, advantages=adv, mask=m,
                                    is_weight=changes["extras"]["is_weight"])
    assert float(algo.policy_loss_count(m)) == m.sum()
    losses_by_mode[over_cap] = float(total / algo.policy_loss_count(m))
  expected = areal_decoupled_loss(logp, old, sampler, adv, m, eps_low, eps_high, cap)
  np.testing.assert_allclose(losses_by_mode["mask"], expected, rtol=1e-9)
  assert abs(losses_by_mode["truncate"] - expected) > 1e-3


def test_over_cap_names_its_key():
  ones = np.ones((2, 2), np.float32)
  with pytest.raises(ValueError, match="algo.rollout_is_over_cap must be one of"):
    correction.rollout_is_weights(ones, ones, ones, level="token", cap=2.0, over_cap="drop")

"""Pass@k advantages (ALGORITHMS.md 8.5): passk vs the sheet's NumPy, the k=1 identity, passk_n."""
import jax
import numpy as np
import pytest

from rljax.algos import passk

from .helpers import jit, prefix_mask

# --- the sheet's NumPy reference ------------------------------------------------------------------
from math import comb
def C(n, k): return comb(n, k) if 0 <= k <= n else 0
def passk_advantage(R, G, k):                        # R: [P*G] in {0,1}; returns [P*G]
    Rg = R.reshape(-1, G); c = Rg.sum(1).astype(int); ap = np.zeros(G + 1); an = np.zeros(G + 1)
    for j in range(G + 1):
        Rb = 1 - C(G - j, k) / C(G, k); sd = np.sqrt(Rb * (1 - Rb))
        ap[j] = (1 - Rb) / (sd + 1e-6); an[j] = (1 - Rb - C(G - j - 1, k - 1) / C(G - 1, k - 1)) / (sd + 1e-6)
    return np.where(Rg == 1, ap[c][:, None], an[c][:, None]).reshape(-1)


def np_passk_n(R, G, std):
  """verl ``grpo_passk`` re-stated: the group's top row gets ``(max - second)``, over the Bessel
  std + 1e-6 when ``std``; everything else 0."""
  out = np.zeros_like(R)
  for g, rows in enumerate(R.reshape(-1, G)):
    order = np.argsort(-rows, kind="stable")
    gap = rows[order[0]] - rows[order[1]]
    if std:
      gap = gap / (np.std(rows, ddof=1) + 1e-6)
    out[g * G + order[0]] = gap
  return out


def binary_rewards(rng, P, G):
  R = rng.integers(0, 2, size=(P, G)).astype(np.float64)
  R[0] = 1.0
  R[1] = 0.0
  R[2, :] = 0.0
  R[2, 0] = 1.0  # one correct
  return R.reshape(-1)


@pytest.mark.parametrize("G", [2, 5])
def test_passk_matches_reference(x64, G):
  rng = np.random.default_rng(G)
  P, T = 6, 3
  R = binary_rewards(rng, P, G)
  m = prefix_mask(rng, P * G, T, np.float64)
  for k in range(1, G + 1):
    adv = passk.passk_advantages(R, m, G, k=k)
    metrics = passk.passk_metrics(R, m, G, k=k)
    want = passk_advantage(R, G, k)
    np.testing.assert_allclose(np.asarray(adv), want[:, None] * m, rtol=1e-6, atol=1e-12)
    rows = (m > 0).any(1)
    np.testing.assert_allclose(float(metrics["passk/zero_frac"][0]) / rows.sum(),
                               (want[rows] == 0).mean())
    for key, sel in (("passk/adv_pos_mean", R == 1), ("passk/adv_neg_mean", R == 0)):
      s, n = metrics[key]
      assert float(n) == (rows & sel).sum()
      np.testing.assert_allclose(float(s), want[rows & sel].sum(), rtol=1e-6, atol=1e-12)
    c = R.reshape(-1, G).sum(1).astype(int)
    groups = rows.reshape(-1, G).any(1)
    r_bar = np.array([1 - C(G - j, k) / C(G, k) for j in c])
    np.testing.assert_allclose(float(metrics["passk/estimate"][0]), r_bar[groups].sum(),
                               rtol=1e-12)


def test_k1_is_grpo_with_population_std(x64):
  rng = np.random.default_rng(1)
  for G in (2, 5):
    R = binary_rewards(rng, 6, G)
    m = np.ones((R.size, 1))
    Rg = R.reshape(-1, G)
    want = (Rg - Rg.mean(1, keepdims=True)) / (Rg.std(1, keepdims=True) + 1e-6)  # ddof=0
    adv = passk.passk_advantages(R, m, G, k=1)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], want.reshape(-1), rtol=1e-9, atol=1e-12)


def test_degenerate_groups_give_exact_zero(x64):
  G, k = 6, 3
  R = np.array([[1.0] * 6, [0.0] * 6, [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]]).reshape(-1)
  adv = passk.passk_advantages(R, np.ones((R.size, 2)), G, k=k)
  adv = np.asarray(adv)[:, 0].reshape(4, G)
  # c = G, c = 0, and G - c = 2 < k: Rbar is 0 or 1, so every advantage is exactly 0.
  assert (adv[[0, 1, 3]] == 0).all()
  assert (adv[2] != 0).all()


def test_table_is_exact_float64_with_binomials():
  a_pos, a_neg, r_bar = passk.passk_table(16, 4)
  assert a_pos.dtype == np.float64 and a_pos.shape == (17,)
  c = 5
  rb = 1 - comb(11, 4) / comb(16, 4)
  assert r_bar[c] == rb
  assert a_neg[c] == (1 - rb - comb(10, 3) / comb(15, 3)) / (np.sqrt(rb * (1 - rb)) + 1e-6)


def test_float32_and_jit_match_reference():
  rng = np.random.default_rng(2)
  R = binary_rewards(rng, 4, 4).astype(np.float32)
  m = np.ones((16, 3), np.float32)
  adv = jit(lambda r, m: passk.passk_advantages(r, m, 4, k=2))(R, m)
  assert np.asarray(adv).dtype == np.float32
  np.testing.assert_allclose(np.asarray(adv)[:, 0], passk_advantage(R.astype(np.float64), 4, 2),
                             rtol=1e-6)


def test_errors_name_the_key():
  R, m = np.array([1.0, 0.0, 1.0, 1.0]), np.ones((4, 2))
  with pytest.raises(ValueError, match="algo.passk_k"):
    passk.passk_advantages(R, m, 2, k=3)
  with pytest.raises(ValueError, match="algo.passk_k"):
    passk.passk_advantages(R, m, 2, k=0)
  with pytest.raises(ValueError, match="group_size >= 2"):
    passk.passk_advantages(R, m, 1, k=1)
  with pytest.raises(ValueError, match="binary rewards"):
    passk.passk_advantages(np.array([1.0, 0.5, 0.0, 1.0]), m, 2, k=1)
  with pytest.raises(Exception, match="binary rewards"):  # under jit: raised by a host callback
    jax.block_until_ready(jit(lambda r: passk.passk_advantages(r, m, 2, k=1))(
        np.array([1.0, 0.5, 0.0, 1.0], np.float32)))
  with pytest.raises(ValueError, match="algo.adv_std"):
    passk.passk_n_advantages(R, m, 2, std_mode="batch")


@pytest.mark.parametrize("std_mode", ["group", "none"])
def test_passk_n_matches_verl(x64, std_mode):
  rng = np.random.default_rng(3)
  for G in (2, 4):
    R = rng.normal(size=(6, G))
    R[0] = 0.3  # all equal: 0 everywhere
    R[1, :2] = 2.0  # a tie at the maximum
    R = R.reshape(-1)
    m = prefix_mask(rng, R.size, 3, np.float64)
    adv = passk.passk_n_advantages(R, m, G, std_mode=std_mode)
    want = np_passk_n(R, G, std_mode == "group")
    np.testing.assert_allclose(np.asarray(adv), want[:, None] * m, rtol=1e-9, atol=1e-12)
    assert (np.asarray(adv)[:G] == 0).all()

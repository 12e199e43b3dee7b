"""ReMax greedy-baseline advantages (ALGORITHMS.md 8.8) vs the sheet's NumPy."""
import numpy as np
import pytest

from rljax.algos import advantages, remax

from .helpers import jit, prefix_mask

B, T = 6, 5


# --- the sheet's NumPy reference (float64) -------------------------------------------------

def remax_advantage(token_rewards, m, baseline_per_prompt, G):
    ret = np.flip(np.cumsum(np.flip(token_rewards * m, 1), 1), 1)
    return (ret - np.repeat(baseline_per_prompt, G)[:, None]) * m


@pytest.mark.parametrize("G", [1, 2, 3])
def test_remax_matches_reference(x64, G):
  rng = np.random.default_rng(G)
  P = 6 // G
  m = prefix_mask(rng, P * G, T, np.float64)
  R = rng.integers(0, 2, size=P * G).astype(np.float64)
  kl_tokens = -0.05 * rng.uniform(size=(P * G, T))
  token_rewards = np.asarray(advantages.outcome_token_rewards(R, m)) + kl_tokens * m
  b = rng.integers(0, 2, size=P).astype(np.float64)
  adv = jit(lambda *a: remax.remax_advantages(*a, G, b))(token_rewards, m)
  metrics = remax.remax_metrics(R, adv, m, G, b)
  np.testing.assert_allclose(np.asarray(adv), remax_advantage(token_rewards, m, b, G),
                             rtol=1e-6, atol=1e-12)
  rows = (m > 0).any(1)
  np.testing.assert_allclose(float(metrics["remax/beat_frac"][0]) / float(
      metrics["remax/beat_frac"][1]), (R > np.repeat(b, G))[rows].mean())
  prompts = rows.reshape(P, G).any(1)
  np.testing.assert_allclose(float(metrics["remax/baseline_mean"][0]), b[prompts].sum())


def test_remax_constant_baseline_is_reward_minus_b(x64):
  rng = np.random.default_rng(9)
  G = 2
  m = prefix_mask(rng, B, T, np.float64)
  R = rng.normal(size=B)
  adv = remax.remax_advantages(advantages.outcome_token_rewards(R, m), m, G, np.full(B // G, 0.25))
  np.testing.assert_allclose(np.asarray(adv), (R - 0.25)[:, None] * m, rtol=1e-12, atol=1e-15)


def test_remax_shape_errors():
  m = np.ones((4, 3))
  with pytest.raises(ValueError, match="remax baseline has 3 prompts"):
    remax.remax_advantages(m, m, 2, np.zeros(3))
  with pytest.raises(ValueError, match="group_size >= 1"):
    remax.remax_metrics(np.zeros(4), m, m, 0, np.zeros(4))

"""Advantage estimators (ALGORITHMS.md section 2) against NumPy float64 references."""
import ml_collections
import numpy as np
import pytest

from rljax.algos import advantages as adv_lib
from rljax.algorithm import resolve

from .helpers import cast, group_rewards, jit, prefix_mask

P, T = 5, 6
WHITEN_EPS = 1e-8


# --- NumPy references, written from the sheet ----------------------------------------------------

def np_group_adv(rewards, group_size, per_group):
  """Apply ``per_group(row) -> [G]`` to each group; zero-spread groups get 0 (the sheet)."""
  groups = rewards.astype(np.float64).reshape(-1, group_size)
  out = np.zeros_like(groups)
  for p, row in enumerate(groups):
    if row.max() != row.min():
      out[p] = per_group(row, p)
  return out.reshape(-1)


def np_grpo(rewards, group_size, std_mode):
  batch_std = rewards.astype(np.float64).std(ddof=1)

  def f(row, _):
    centred = row - row.mean()
    if std_mode == "group":
      return centred / (row.std(ddof=1) + 1e-6)
    if std_mode == "batch":
      return centred / (batch_std + 1e-6)
    return centred

  return np_group_adv(rewards, group_size, f)


def np_rloo(rewards, group_size):
  def f(row, _):
    return np.array([row[i] - np.delete(row, i).mean() for i in range(len(row))])
  return np_group_adv(rewards, group_size, f)


def np_opo(rewards, mask, group_size):
  lengths = mask.sum(1).astype(np.float64).reshape(-1, group_size)

  def f(row, p):
    if lengths[p].sum() == 0:
      return np.zeros_like(row)  # every token is padding: nothing to compare
    return row - (lengths[p] * row).sum() / lengths[p].sum()

  return np_group_adv(rewards, group_size, f)


def np_gpg(rewards, group_size):
  groups = rewards.astype(np.float64).reshape(-1, group_size)
  num_flat = sum(row.max() == row.min() for row in groups)
  num_prompts = len(groups)
  alpha = num_prompts / (num_prompts - num_flat) if num_prompts > num_flat else 0.0
  return np_group_adv(rewards, group_size, lambda row, _: alpha * (row - row.mean()))


def np_broadcast(adv_rows, mask):
  return adv_rows[:, None] * (mask > 0)


def np_whiten(x, mask):
  valid = mask > 0
  vals = x[valid].astype(np.float64)
  n = vals.size
  if n < 2:
    return np.zeros_like(x, dtype=np.float64)
  mean = vals.mean()
  var = ((vals - mean) ** 2).sum() / (n - 1)
  return np.where(valid, (x - mean) / np.sqrt(var + WHITEN_EPS), 0.0)


def np_returns_to_go(token_rewards, mask, gamma):
  """``G_j = sum_{k >= j} gamma^(k-j) r_k`` over the valid positions of each row (closed form)."""
  out = np.zeros(token_rewards.shape)
  for i in range(len(mask)):
    idx = np.flatnonzero(mask[i] > 0)
    r = token_rewards[i, idx].astype(np.float64)
    for j in range(len(idx)):
      out[i, idx[j]] = sum(gamma ** (k - j) * r[k] for k in range(j, len(idx)))
  return out


def np_gae(token_rewards, values, mask, gamma, lam_rows):
  """``A_j = sum_{k >= j} (gamma lam)^(k-j) delta_k``, ``delta_k = r_k + gamma V_{k+1} - V_k``."""
  out = np.zeros(token_rewards.shape)
  for i in range(len(mask)):
    idx = np.flatnonzero(mask[i] > 0)
    r = token_rewards[i, idx].astype(np.float64)
    v = values[i, idx].astype(np.float64)
    v_next = np.append(v[1:], 0.0)
    deltas = r + gamma * v_next - v
    for j in range(len(idx)):
      out[i, idx[j]] = sum((gamma * lam_rows[i]) ** (k - j) * deltas[k]
                           for k in range(j, len(idx)))
  return out


def np_adaptive_lam(mask, alpha):
  lengths = mask.sum(1).astype(np.float64)
  with np.errstate(divide="ignore"):
    return np.clip(1.0 - 1.0 / (alpha * lengths), 0.0, 1.0)


# --- inputs --------------------------------------------------------------------------------------

def make_inputs(seed, group_size, dtype):
  rng = np.random.default_rng(seed)
  batch = P * group_size
  rewards = group_rewards(rng, P, group_size, dtype)
  mask = prefix_mask(rng, batch, T, dtype)
  # Garbage on padding: an estimator must not read it.
  token_rewards = rng.normal(size=(batch, T)).astype(dtype)
  values = rng.normal(size=(batch, T)).astype(dtype)
  return rewards, mask, token_rewards, values


_COMPILED = {}


def run(algo_cfg, name, rewards, mask, group_size, values=None, token_rewards=None, **keys):
  """``compute_advantages`` under jit: it must trace, and one compilation is faster than
  dispatching each op eagerly. Compiled functions are reused for the same config values."""
  algo_cfg.advantage = name
  for key, value in keys.items():
    setattr(algo_cfg, key, value)
  frozen = ml_collections.FrozenConfigDict(algo_cfg)
  cache_key = (frozen, group_size)
  if cache_key not in _COMPILED:
    algo = resolve(algo_cfg, group_size=group_size, critic=values is not None)
    _COMPILED[cache_key] = jit(
        lambda rewards, mask, values, token_rewards: algo.advantages(
            rewards=rewards, mask=mask, values=values, token_rewards=token_rewards))
  return _COMPILED[cache_key](rewards, mask, values, token_rewards)


def assert_close(actual, expected, prec):
  actual = np.asarray(actual)
  assert actual.dtype == prec.dtype, (actual.dtype, prec.dtype)
  assert np.all(np.isfinite(actual))
  np.testing.assert_allclose(actual, expected, rtol=prec.rtol, atol=prec.atol * 10)


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("group_size", [2, 4])
@pytest.mark.parametrize("std_mode", ["group", "batch", "none"])
def test_grpo_matches_numpy(prec, algo_cfg, group_size, std_mode):
  rewards, mask, _, _ = make_inputs(0, group_size, prec.dtype)
  adv, ret = run(algo_cfg, "grpo", rewards, mask, group_size, adv_std=std_mode)
  assert ret is None
  assert_close(adv, np_broadcast(np_grpo(rewards, group_size, std_mode), mask), prec)


@pytest.mark.parametrize("group_size", [2, 4])
@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "opo", "gpg"])
def test_group_estimators_match_numpy(prec, algo_cfg, group_size, name):
  rewards, mask, _, _ = make_inputs(1, group_size, prec.dtype)
  expected = {
      "dr_grpo": lambda: np_grpo(rewards, group_size, "none"),
      "rloo": lambda: np_rloo(rewards, group_size),
      "opo": lambda: np_opo(rewards, mask, group_size),
      "gpg": lambda: np_gpg(rewards, group_size),
  }[name]()
  adv, _ = run(algo_cfg, name, rewards, mask, group_size)
  assert_close(adv, np_broadcast(expected, mask), prec)


def test_gpg_alpha_counts_zero_spread_groups(x64, algo_cfg):
  rewards = np.array([1., 1., 0., 0., 1., 0., 0., 1.])  # groups: flat, flat, spread, spread
  mask = np.ones((8, 3))
  adv, _ = run(algo_cfg, "gpg", rewards, mask, 2)
  np.testing.assert_allclose(np.asarray(adv)[4:, 0], 2.0 * np.array([0.5, -0.5, -0.5, 0.5]))
  adv, _ = run(algo_cfg, "gpg", np.ones(8), mask, 2)  # P == M: alpha guarded
  assert np.all(np.asarray(adv) == 0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "opo", "gpg"])
def test_zero_spread_groups_give_exact_zero(algo_cfg, name):
  rewards = np.array([0.1] * 4 + [1.0] * 4 + [0.3, 0.3, 0.3, 0.7], np.float32)
  mask = np.ones((12, 3), np.float32)
  mask[1] = 0  # a row with no valid token inside a flat group
  adv, _ = run(algo_cfg, name, rewards, mask, 4)
  adv = np.asarray(adv)
  assert np.all(np.isfinite(adv))
  assert np.all(adv[:8] == 0.0)
  assert np.all(adv[8:] != 0.0)


def test_dr_grpo_is_grpo_without_std(prec, algo_cfg):
  rewards, mask, _, _ = make_inputs(2, 4, prec.dtype)
  dr, _ = run(algo_cfg, "dr_grpo", rewards, mask, 4)
  grpo, _ = run(algo_cfg, "grpo", rewards, mask, 4, adv_std="none")
  np.testing.assert_array_equal(np.asarray(dr), np.asarray(grpo))


@pytest.mark.parametrize("group_size", [2, 4])
def test_rloo_is_scaled_centred_reward(prec, algo_cfg, group_size):
  rewards, mask, _, _ = make_inputs(3, group_size, prec.dtype)
  adv, _ = run(algo_cfg, "rloo", rewards, mask, group_size)
  centred = np_grpo(rewards, group_size, "none")
  assert_close(adv, np_broadcast(group_size / (group_size - 1) * centred, mask), prec)


def test_group_size_below_two_is_an_error(algo_cfg):
  mask = np.ones((4, 3), np.float32)
  for name in ["grpo", "dr_grpo", "rloo", "opo", "gpg", "reinforce_pp_baseline"]:
    with pytest.raises(ValueError, match="group_size >= 2"):
      run(algo_cfg, name, np.ones(4, np.float32), mask, 1)
  with pytest.raises(ValueError, match="whole number of groups"):
    run(algo_cfg, "grpo", np.ones(4, np.float32), mask, 3)


def test_bad_adv_std_names_the_key(algo_cfg):
  with pytest.raises(ValueError, match="algo.adv_std"):
    run(algo_cfg, "grpo", np.ones(4, np.float32), np.ones((4, 2), np.float32), 2, adv_std="grp")


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_numpy(prec, algo_cfg, gamma):
  rewards, mask, token_rewards, _ = make_inputs(4, 4, prec.dtype)
  adv, ret = run(algo_cfg, "reinforce_pp", rewards, mask, 4, token_rewards=token_rewards,
                 gamma=gamma)
  assert ret is None
  assert_close(adv, np_whiten(np_returns_to_go(token_rewards, mask, gamma), mask), prec)
  # It whitens by definition: in a run's config adv_whiten=True would do nothing, so it is
  # refused by name.
  from configs.base import get_config
  config = get_config()
  config.algo.advantage, config.algo.adv_whiten = "reinforce_pp", True
  with pytest.raises(ValueError, match="algo.adv_whiten=True is not used by advantage "
                                       "'reinforce_pp'"):
    resolve(config)


def test_reinforce_pp_baseline_matches_numpy(prec, algo_cfg):
  rewards, mask, _, _ = make_inputs(5, 2, prec.dtype)
  adv, _ = run(algo_cfg, "reinforce_pp_baseline", rewards, mask, 2)
  expected = np_whiten(np_broadcast(np_grpo(rewards, 2, "none"), mask), mask)
  assert_close(adv, expected, prec)


@pytest.mark.parametrize("lam_critic,lam_alpha,whiten", [
    (None, None, False), (1.0, None, True), (1.0, 0.4, False), (None, 0.4, True)])
def test_gae_matches_numpy(prec, algo_cfg, lam_critic, lam_alpha, whiten):
  rewards, mask, token_rewards, values = make_inputs(6, 4, prec.dtype)
  # With lam_alpha the adaptive lambda replaces lam, which then stays at its default (a set,
  # unread lam is refused).
  gamma, lam = 0.97, 0.9 if lam_alpha is None else 0.95
  adv, ret = run(algo_cfg, "gae", rewards, mask, 4, values=values, token_rewards=token_rewards,
                 gamma=gamma, lam=lam, lam_critic=lam_critic, lam_alpha=lam_alpha,
                 adv_whiten=whiten)
  batch = len(mask)
  lam_rows = np.full(batch, lam) if lam_alpha is None else np_adaptive_lam(mask, lam_alpha)
  critic_rows = lam_rows if lam_critic is None else np.full(batch, lam_critic)
  expected = np_gae(token_rewards, values, mask, gamma, lam_rows)
  if whiten:
    expected = np_whiten(expected, mask)
  expected_ret = (np_gae(token_rewards, values, mask, gamma, critic_rows) + values) * (mask > 0)
  assert_close(adv, expected, prec)
  assert_close(ret, expected_ret, prec)


def test_gae_lam_one_returns_are_returns_to_go(x64, algo_cfg):
  """Monte-Carlo critic targets (lam_critic = 1): ``GAE(1) + V`` telescopes to the return."""
  rewards, mask, token_rewards, values = make_inputs(7, 2, np.float64)
  _, ret = run(algo_cfg, "gae", rewards, mask, 2, values=values, token_rewards=token_rewards,
               gamma=0.9, lam_critic=1.0)
  np.testing.assert_allclose(np.asarray(ret), np_returns_to_go(token_rewards, mask, 0.9),
                             rtol=1e-10, atol=1e-12)


def test_length_adaptive_lam(x64):
  mask = prefix_mask(np.random.default_rng(8), 8, 40, np.float64)
  lam = jit(lambda m: adv_lib.length_adaptive_lam(m, 0.05))(mask)
  expected = np_adaptive_lam(mask, 0.05)
  valid = mask.sum(1) > 0
  np.testing.assert_allclose(np.asarray(lam)[valid], expected[valid], rtol=1e-12)
  assert np.all((np.asarray(lam) >= 0) & (np.asarray(lam) <= 1))


@pytest.mark.parametrize("name", ["grpo", "gpg"])
def test_adv_whiten_applies_to_outcome_estimators(x64, algo_cfg, name):
  rewards, mask, _, _ = make_inputs(9, 4, np.float64)
  white, _ = run(algo_cfg, name, rewards, mask, 4, adv_whiten=True)
  raw = np_grpo(rewards, 4, "group") if name == "grpo" else np_gpg(rewards, 4)
  assert_close(white, np_whiten(np_broadcast(raw, mask), mask), x64)


def test_whiten_padding_and_tiny_batches(x64):
  x = np.random.default_rng(10).normal(size=(3, 4))
  mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float64)
  whiten = jit(adv_lib.whiten)
  out = np.asarray(whiten(x, mask))
  np.testing.assert_allclose(out, np_whiten(x, mask), rtol=1e-12)
  assert np.all(out[mask == 0] == 0)
  np.testing.assert_allclose(out[mask > 0].std(ddof=1), 1.0, rtol=1e-6)
  # one valid token, no valid token: zeros, not NaN
  one = mask.copy()
  one[0] = 0
  assert np.all(np.asarray(whiten(x, one)) == 0)
  assert np.all(np.asarray(whiten(x, np.zeros_like(mask))) == 0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "opo", "gpg", "reinforce_pp",
                                  "reinforce_pp_baseline", "gae"])
def test_rows_without_tokens_make_no_nan(algo_cfg, name):
  rewards = np.array([1., 0., 1., 1.], np.float32)
  mask = np.zeros((4, 3), np.float32)
  values = np.ones((4, 3), np.float32)
  for m in (mask, np.concatenate([np.ones((2, 3)), np.zeros((2, 3))]).astype(np.float32)):
    adv, ret = run(algo_cfg, name, rewards, m, 2, values=values, token_rewards=values,
                   lam_alpha=0.05, adv_whiten=True)
    assert np.all(np.isfinite(np.asarray(adv)))
    assert np.all(np.asarray(adv)[m == 0] == 0)
    if ret is not None:
      assert np.all(np.isfinite(np.asarray(ret)))


@pytest.mark.parametrize("name,keys", [
    ("grpo", {"adv_std": "group"}), ("grpo", {"adv_std": "batch"}), ("dr_grpo", {}),
    ("rloo", {}), ("opo", {}), ("gpg", {}), ("reinforce_pp_baseline", {}), ("reinforce_pp", {}),
    ("grpo", {"adv_std": "batch", "adv_whiten": True})])
def test_padding_groups_change_no_advantage(x64, algo_cfg, name, keys):
  """Dynamic sampling fills a short batch with zero-mask copies of its first group: the real
  rows' advantages must be those of the batch without them (batch std and GPG's alpha included)."""
  group_size = 4
  rewards, mask, token_rewards, _ = make_inputs(11, group_size, np.float64)
  rewards[:group_size] = [1.0, 1.0, 1.0, 1.0]  # a zero-spread group, as GPG counts them
  pad = lambda x, fill: np.concatenate([x, np.repeat(fill, 2, axis=0)])
  padded = (pad(rewards, rewards[:group_size]), pad(mask, np.zeros_like(mask[:group_size])),
            pad(token_rewards, token_rewards[:group_size]))
  plain, _ = run(algo_cfg, name, rewards, mask, group_size, token_rewards=token_rewards, **keys)
  with_pad, _ = run(algo_cfg, name, padded[0], padded[1], group_size, token_rewards=padded[2],
                    **keys)
  n = len(rewards)
  np.testing.assert_allclose(np.asarray(with_pad)[:n], np.asarray(plain), rtol=1e-12, atol=1e-12)
  assert np.all(np.asarray(with_pad)[n:] == 0)


def test_outcome_token_rewards(x64):
  mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], np.float64)
  rewards = np.array([2.0, -1.0, 5.0, 3.0])
  out = np.asarray(jit(adv_lib.outcome_token_rewards)(rewards, mask))
  expected = np.zeros((4, 4))
  expected[0, 2], expected[1, 0], expected[3, 3] = 2.0, -1.0, 3.0
  np.testing.assert_array_equal(out, expected)


def test_dispatcher_errors(algo_cfg):
  rewards, mask = np.ones(4, np.float32), np.ones((4, 3), np.float32)
  with pytest.raises(KeyError, match="algo.advantage.*grpo, opo"):
    run(algo_cfg, "grpoo", rewards, mask, 2)
  with pytest.raises(ValueError, match="needs critic values: set critic.enabled=True"):
    run(algo_cfg, "gae", rewards, mask, 2, token_rewards=mask)


def test_token_rewards_default_to_the_outcome_on_the_last_token(x64, algo_cfg):
  rewards, mask, _, _ = make_inputs(9, 2, np.float64)
  outcome = np.asarray(adv_lib.outcome_token_rewards(rewards, mask))
  implicit, _ = run(algo_cfg, "reinforce_pp", rewards, mask, 2)
  explicit, _ = run(algo_cfg, "reinforce_pp", rewards, mask, 2, token_rewards=outcome)
  np.testing.assert_array_equal(np.asarray(implicit), np.asarray(explicit))


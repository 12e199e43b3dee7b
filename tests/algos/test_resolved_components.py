"""Section 8 registry entries (registered where each function is defined, imported by
``rljax.algos``) resolve like the other components and call the pure functions."""
import numpy as np
import pytest

from rljax.algos import cov, passk, remax, sapo
from rljax.algorithm import resolve

from .helpers import log_ratios, prefix_mask

OBJECTIVES = ("sapo", "clip_cov", "kl_cov")
ESTIMATORS = ("passk", "passk_n", "remax")
NEW_KEYS = dict(sapo_tau_pos=0.9, sapo_tau_neg=1.3, sapo_level="token", kl_cov_coef=0.7,
                passk_k=2)
B, T, G = 8, 5, 4


def algo_settings(**overrides):
  from configs.base import get_config
  settings = get_config().algo.to_dict()
  settings.update(NEW_KEYS, kl_placement="none", **overrides)
  return settings


def inputs(seed=0):
  rng = np.random.default_rng(seed)
  m = prefix_mask(rng, B, T)
  old = -rng.uniform(0.01, 5.0, size=(B, T)).astype(np.float32)
  logp = (old + log_ratios(rng, (B, T))).astype(np.float32)
  adv = (np.repeat(rng.normal(size=(B, 1)), T, 1) * m).astype(np.float32)
  rewards = rng.integers(0, 2, size=B).astype(np.float32)
  return logp, old, adv, m, rewards


def test_objectives_resolve_and_match_the_pure_functions():
  logp, old, adv, m, _ = inputs()
  sel = np.zeros((B, T), bool)
  sel[1, :2] = True
  cases = {
      "sapo": sapo.sapo_loss(logp, old, adv, m, tau_pos=0.9, tau_neg=1.3)[0],
      "clip_cov": cov.clip_cov_loss(logp, old, adv, m, sel, eps_low=0.2, eps_high=0.28)[0],
      "kl_cov": cov.kl_cov_loss(logp, old, adv, m, sel, coef=0.7)[0],
  }
  for name, per_token in cases.items():
    algo = resolve(algo_settings(policy_loss=name, clip_eps_high=0.28), group_size=G)
    total, metrics = algo.policy_loss_sum(logp=logp, old_logp=old, advantages=adv, mask=m,
                                          cov_sel=sel)
    expected_agg = "seq_mean_token_mean" if name == "sapo" else algo_settings()["loss_agg"]
    assert algo.policy_agg == expected_agg
    valid = m > 0
    if expected_agg == "seq_mean_token_mean":
      want = (np.where(valid, per_token, 0).sum(1) / np.maximum(valid.sum(1), 1)).sum()
    else:
      want = np.where(valid, per_token, 0).sum()
    np.testing.assert_allclose(float(total), want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert "ratio_mean" in metrics


def test_sapo_sequence_level_and_a_bad_level():
  logp, old, adv, m, _ = inputs(1)
  algo = resolve(algo_settings(policy_loss="sapo", sapo_level="sequence"), group_size=G)
  loss, _ = algo.objective(algo.hparams, logp=logp, old_logp=old, advantages=adv, mask=m)
  want, _ = sapo.sapo_sequence_loss(logp, old, adv, m, tau_pos=0.9, tau_neg=1.3)
  np.testing.assert_allclose(np.asarray(loss), np.asarray(want), rtol=1e-6)
  with pytest.raises(ValueError, match="algo.sapo_level"):  # at resolve
    resolve(algo_settings(policy_loss="sapo", sapo_level="row"), group_size=G)
  with pytest.raises(ValueError, match="algo.sapo_level"):  # and called directly
    sapo.sapo_objective(logp, old, adv, m, tau_pos=1.0, tau_neg=1.0, level="row")


def test_estimators_resolve_and_match_the_pure_functions():
  _, _, _, m, rewards = inputs(2)
  algo = resolve(algo_settings(advantage="passk"), group_size=G)
  adv, returns = algo.advantages(rewards=rewards, mask=m)
  assert returns is None
  np.testing.assert_array_equal(np.asarray(adv), np.asarray(
      passk.passk_advantages(rewards, m, G, k=2)))
  algo = resolve(algo_settings(advantage="passk_n", adv_std="none"), group_size=G)
  adv, _ = algo.advantages(rewards=rewards, mask=m)
  np.testing.assert_array_equal(np.asarray(adv), np.asarray(
      passk.passk_n_advantages(rewards, m, G, std_mode="none")))


def test_remax_allows_one_completion_per_prompt_and_reads_its_baseline():
  _, _, _, m, rewards = inputs(3)
  algo = resolve(algo_settings(advantage="remax"), group_size=1)
  token_rewards = np.zeros((B, T), np.float32)
  token_rewards[:, 0] = rewards
  baseline = np.full(B, 0.5, np.float32)
  adv = algo.advantage(algo.hparams, token_rewards=token_rewards, mask=m, group_size=1,
                       remax_baseline=baseline)
  np.testing.assert_array_equal(np.asarray(adv), np.asarray(
      remax.remax_advantages(token_rewards, m, 1, baseline)))
  with pytest.raises(ValueError, match="group_size >= 2"):
    resolve(algo_settings(advantage="passk"), group_size=1)


def test_passk_k_is_required():
  _, _, _, m, rewards = inputs(4)
  with pytest.raises(ValueError, match="algo.passk_k"):  # at resolve, before anything runs
    resolve(algo_settings(advantage="passk", passk_k=None), group_size=G)
  algo = resolve(algo_settings(advantage="passk", passk_k=G + 1), group_size=G)
  with pytest.raises(ValueError, match="algo.passk_k"):
    algo.advantages(rewards=rewards, mask=m)

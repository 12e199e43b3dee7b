"""Registries: a config name that is not registered is an error listing what exists."""
import pytest

import rljax.algos as algos
from rljax.algos.registry import Registry, UnknownNameError

EXPECTED = {
    "advantage": {"grpo", "dr_grpo", "rloo", "opo", "gpg", "reinforce_pp",
                  "reinforce_pp_baseline", "gae", "passk", "passk_n", "remax"},
    "policy_loss": {"ppo", "gspo", "cispo", "gmpo", "pg", "sapo", "clip_cov", "kl_cov"},
    "loss_agg": {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                 "seq_mean_token_sum_norm", "sequence_mean"},
    "kl_estimator": {"k1", "k2", "k3", "low_var_kl", "k3+"},
    "regularizer": {"kl", "entropy", "pos_lm", "router_balance"},
}


def test_every_sheet_component_is_registered():
  assert {k: set(v) for k, v in algos.list_registries().items()} == EXPECTED


@pytest.mark.parametrize("registry,key", [
    (algos.ADVANTAGES, "algo.advantage"), (algos.POLICY_LOSSES, "algo.policy_loss"),
    (algos.LOSS_AGGS, "algo.loss_agg"), (algos.KL_ESTIMATORS, "algo.kl_estimator")])
def test_unknown_name_error_names_family_key_and_choices(registry, key):
  with pytest.raises(UnknownNameError) as info:
    registry.get("nope")
  message = str(info.value)
  assert registry.what in message and key in message and "'nope'" in message
  assert all(name in message for name in registry.names())
  assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_register_get_names_meta_and_duplicates():
  reg = Registry("widget", "widget", "x.widget", signature=True)

  @reg.register("b", flavour="sweet")
  def b():
    return 2

  reg.register("a")(lambda: 1)
  assert reg.names() == ["a", "b"] and "a" in reg and "c" not in reg
  assert reg.get("b") is b
  assert reg.meta("b") == {"flavour": "sweet", "reads": (), "inputs": (), "hparams": {},
                           "defaults": {}}
  with pytest.raises(ValueError, match="already registered"):
    reg.register("a")(lambda: 3)
  with pytest.raises(KeyError, match="^unknown widget 'c' \\(x.widget\\); registered: a, b$"):
    reg.meta("c")


def test_inputs_and_hyperparameters_come_from_the_signature():
  reg = Registry("widget", "widget", "x.widget", signature=True)

  @reg.register("w", hparams={"scale": "widget_scale"})
  def w(values, mask, *, scale, mode="sum", offset):
    return values, mask, scale, mode, offset

  meta = reg.meta("w")
  assert meta["inputs"] == ("values", "mask")
  # Every keyword-only parameter is read from a key (its own name unless mapped); a default
  # applies only where the config has no such key.
  assert meta["hparams"] == {"scale": "widget_scale", "mode": "mode", "offset": "offset"}
  assert meta["defaults"] == {"mode": "sum"}
  with pytest.raises(ValueError, match="not keyword-only parameters"):
    reg.register("bad", hparams={"valus": "x"})(lambda values, *, scale: values)


def test_floats_are_traced_and_other_settings_static(algo_cfg):
  from rljax.algorithm import resolve
  algo_cfg.policy_loss, algo_cfg.cispo_eps_low = "cispo", None
  algo = resolve(algo_cfg)
  assert dict(algo.objective.traced) == {"eps_high": "cispo_eps_high"}
  assert dict(algo.objective.static) == {"eps_low": None}
  assert algo.hparams["cispo_eps_high"] == 4.0
  algo_cfg.advantage, algo_cfg.adv_std = "grpo", "batch"
  # grpo's eps is no config key: its own default is bound.
  assert dict(resolve(algo_cfg).advantage.static) == {"std_mode": "batch", "eps": 1e-6}


def test_a_component_reading_a_missing_key_fails_at_resolve(algo_cfg):
  from rljax.algorithm import resolve

  @algos.register_policy_loss("test_needs_missing_key")
  def needs_missing_key(logp, old_logp, advantages, mask, *, no_such_key):
    return -advantages * logp, {}

  try:
    algo_cfg.policy_loss = "test_needs_missing_key"
    with pytest.raises(KeyError, match="reads algo.no_such_key"):
      resolve(algo_cfg)
  finally:
    algos.POLICY_LOSSES.unregister("test_needs_missing_key")

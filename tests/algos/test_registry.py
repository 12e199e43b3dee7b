"""Registries: a config name that is not registered is an error listing what exists."""
import pytest

import rljax.algos as algos
from rljax.algos.registry import Registry, UnknownNameError

EXPECTED = {
    "advantage": {"grpo", "dr_grpo", "rloo", "opo", "gpg", "reinforce_pp",
                  "reinforce_pp_baseline", "gae"},
    "policy_loss": {"ppo", "gspo", "cispo", "gmpo", "pg"},
    "loss_agg": {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                 "seq_mean_token_sum_norm"},
    "kl_estimator": {"k1", "k2", "k3", "low_var_kl", "k3+"},
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
  assert registry.family in message and key in message and "'nope'" in message
  assert all(name in message for name in registry.names())
  assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_register_get_names_meta_and_duplicates():
  reg = Registry("widget", "x.widget")

  @reg.register("b", flavour="sweet")
  def b():
    return 2

  reg.register("a")(lambda: 1)
  assert reg.names() == ["a", "b"] and "a" in reg and "c" not in reg
  assert reg.get("b") is b and reg.meta("b") == {"flavour": "sweet"}
  with pytest.raises(ValueError, match="already registered"):
    reg.register("a")(lambda: 3)
  with pytest.raises(KeyError, match="unknown widget 'c' \\(x.widget\\); registered widget "
                                     "names: a, b"):
    reg.meta("c")

"""``resolve`` reads the transforms' keys once: which transforms are on, their traced floats,
and the combinations they refuse, each naming its key."""
import pytest

from configs.base import get_config
from rljax.algorithm import resolve
from rljax.errors import UnusedKeyError


def settings(**overrides):
  algo = get_config().algo.to_dict()
  algo.update(**{"kl_placement": "none", **overrides})
  return algo


def test_tis_cap_is_the_token_level_alias_and_not_both():
  algo = resolve(settings(tis_cap=3.0))
  assert algo.loss_weights == ("is_weight",) and algo.hparams["rollout_is_cap"] == 3.0
  keys = algo.transform("rollout_correction").keys
  assert "tis_cap" in keys and "rollout_is" not in keys and "rollout_is_cap" not in keys
  with pytest.raises(ValueError, match="algo.tis_cap.*algo.rollout_is='sequence'"):
    resolve(settings(tis_cap=3.0, rollout_is="sequence"))


def test_over_cap_is_read_only_with_weights():
  config = get_config()
  config.algo.rollout_is_over_cap = "mask"
  with pytest.raises(UnusedKeyError, match=r"algo.rollout_is_over_cap='mask' is not used.*"
                                                  r"transform 'rollout_correction'"):
    resolve(config)
  for weights in (dict(rollout_is="sequence"), dict(tis_cap=3.0)):
    config.algo.update(weights)
    keys = resolve(config).transform("rollout_correction").keys
    assert "rollout_is_over_cap" in keys
    config.algo.update(rollout_is="none", tis_cap=None)
  config.algo.update(rollout_rs="token", rollout_rs_hi=2.0)  # rejection alone: no weights
  with pytest.raises(UnusedKeyError, match="algo.rollout_is_over_cap"):
    resolve(config)


def test_transforms_that_need_old_logp():
  assert not resolve(settings()).needs_old_logp
  for overrides in (dict(rollout_is="geometric"), dict(rollout_rs="token", rollout_rs_hi=2.0),
                    dict(rollout_rs_k3=0.01), dict(policy_loss="kl_cov"),
                    dict(entropy_top_rho=0.2), dict(opd_coef=1.0),
                    dict(entropy_ctrl=True, entropy_ctrl_estimate="sampled")):
    assert resolve(settings(**overrides)).needs_old_logp, overrides
  assert not resolve(settings(entropy_ctrl=True)).needs_old_logp
  assert resolve(settings(kl_placement="loss", kl_target=0.1)).needs_old_logp  # adaptive KL


@pytest.mark.parametrize("overrides,message", [
    (dict(rollout_rs="token"), "algo.rollout_rs='token' needs algo.rollout_rs_lo"),
    (dict(rollout_rs="sequence", rollout_rs_lo=2.0, rollout_rs_hi=1.0), "rollout_rs_lo <="),
    (dict(rollout_is="token", rollout_is_floor=3.0), "algo.rollout_is_floor=3.0"),
    (dict(rollout_is="token", policy_loss="gmpo", loss_agg="sequence_mean"),
     "one loss per sequence"),
    (dict(entropy_top_rho=0.2, entropy_mask_source="current"),
     "algo.entropy_mask_source='current' is not supported"),
    (dict(policy_loss="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0), "algo.clip_cov_lb=5.0"),
    (dict(entropy_ctrl=True, entropy_coef_min=0.1, entropy_coef_max=0.0),
     "algo.entropy_coef_min=0.1"),
    (dict(advantage="passk"), "algo.passk_k"),
])
def test_refused_combinations_name_the_key(overrides, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
    resolve(settings(**overrides), group_size=4)


def test_entropy_controller_turns_the_bonus_on_from_zero():
  assert not [r for r in resolve(settings(entropy_coef=0.0)).regularizers if r.name == "entropy"]
  algo = resolve(settings(entropy_coef=0.0, entropy_ctrl=True))
  assert [r.coef for r in algo.regularizers if r.name == "entropy"] == ["entropy_coef"]
  assert {"entropy_target", "entropy_coef_delta", "entropy_coef_min",
          "entropy_coef_max"} <= set(algo.hparams)

"""An update schedule that cannot run is refused before any model is loaded, naming its keys."""
import pytest

from rljax.config import loader as config_loader
from rljax.train import loop, policy

from . import tiny


def _ids(cases):
  """Test ids from the overridden values (``algo.epochs=-1``), not pytest's ``overrides<i>-<regex>``:
  an id that names the case and holds no regex, quotes or spaces."""
  return ["+".join(f"{k}={v}" for k, v in overrides.items()) for overrides, _ in cases]


def _config(tmp_path, **overrides):
  args = tiny.args("grpo", str(tmp_path / "run"), {k: str(v) for k, v in overrides.items()})
  path, parsed, _ = config_loader.split_config_args(args[1:])
  return config_loader.load_config(path, parsed)


BAD_SCHEDULES = [
    ({"algo.micro_batches": 0}, r"algo.micro_batches=0 .*an integer >= 1"),
    ({"algo.epochs": -1}, r"algo.epochs=-1 .*an integer >= 1"),
    ({"rollout.prompts_per_step": 0}, r"rollout.prompts_per_step=0 .*an integer >= 1"),
    ({"algo.minibatches": 3},
     r"= 8 rows do not split into algo.minibatches=3 x algo.micro_batches=1"),
    ({"algo.minibatches": 2, "algo.micro_batches": 8}, r"8 rows do not split"),
]


@pytest.mark.parametrize("overrides,message", BAD_SCHEDULES, ids=_ids(BAD_SCHEDULES))
def test_bad_schedule_is_named_before_loading(monkeypatch, tmp_path, overrides, message):
  def never(*args, **kwargs):
    raise AssertionError("the model was loaded before the schedule was checked")
  monkeypatch.setattr(policy, "load_policy", never)
  with pytest.raises(ValueError, match=message):
    loop.train(_config(tmp_path, **overrides))


BAD_VALUES = [
    ({"algo.advantage": "grpoo"}, r"algo.advantage='grpoo' is not allowed: expected a "
                                  r"registered advantage name: dr_grpo, gae"),
    ({"algo.policy_loss": "ppoo"}, r"algo.policy_loss='ppoo' .*cispo, clip_cov, gmpo"),
    ({"algo.loss_agg": "tokenmean"}, r"algo.loss_agg='tokenmean' is not allowed"),
    ({"algo.kl_estimator": "k4"}, r"algo.kl_estimator='k4' is not allowed"),
    ({"reward.fn": "exact_mach"}, r"reward.fn='exact_mach' is not allowed: expected a "
                                  r"registered reward_fn name: .*exact_match"),
    ({"algo.clip_eps_low": -0.1}, r"clip_eps_low=-0.1"),
    ({"algo.dual_clip_c": 0.5}, r"algo.dual_clip_c=0.5"),
    ({"algo.ref_ema_decay": 1.5}, r"ref_ema_decay=1.5"),
    ({"rollout.group_size": 1}, r"group_size"),
]


@pytest.mark.parametrize("overrides,message", BAD_VALUES, ids=_ids(BAD_VALUES))
def test_unknown_name_or_bad_value_fails_within_a_second(monkeypatch, tmp_path, overrides,
                                                         message):
  """Names are resolved and values range-checked before any model is built or trained: the
  error comes in well under a second of wall clock (imports excluded: they are done here)."""
  import time

  def never(*args, **kwargs):
    raise AssertionError("the model was loaded before the config was checked")
  monkeypatch.setattr(policy, "load_policy", never)
  config = _config(tmp_path, **overrides)
  start = time.perf_counter()
  with pytest.raises((KeyError, ValueError), match=message):
    loop.train(config)
  assert time.perf_counter() - start < 1.0

"""An update schedule that cannot run is refused before any model is loaded, naming its keys."""
import pytest

from rljax import config_loader
from rljax.train import build, loop

from . import tiny


def _config(tmp_path, **overrides):
  args = tiny.args("grpo", str(tmp_path / "run"), {k: str(v) for k, v in overrides.items()})
  path, parsed, _ = config_loader.split_config_args(args[1:])
  return config_loader.load_config(path, parsed)


@pytest.mark.parametrize("overrides,message", [
    ({"algo.micro_batches": 0}, r"algo.micro_batches=0 must be an integer >= 1"),
    ({"algo.epochs": -1}, r"algo.epochs=-1 must be an integer >= 1"),
    ({"rollout.prompts_per_step": 0}, r"rollout.prompts_per_step=0 must be an integer >= 1"),
    ({"algo.minibatches": 3},
     r"= 8 rows do not split into algo.minibatches=3 x algo.micro_batches=1"),
    ({"algo.minibatches": 2, "algo.micro_batches": 8}, r"8 rows do not split"),
])
def test_bad_schedule_is_named_before_loading(monkeypatch, tmp_path, overrides, message):
  def never(*args, **kwargs):
    raise AssertionError("the model was loaded before the schedule was checked")
  monkeypatch.setattr(build, "load_policy", never)
  with pytest.raises(ValueError, match=message):
    loop.train(_config(tmp_path, **overrides))

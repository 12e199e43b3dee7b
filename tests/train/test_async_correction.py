"""Asynchronous runs without a rollout correction are warned about at start-up, in one line:
their stale samples are trained as if the current policy had drawn them (docs/async.md)."""
import os

import pytest

from rljax.config import loader as config_loader
from rljax.train import actors, loop
from tests.train import tiny


def test_warning_only_when_stale_and_uncorrected():
  assert actors.uncorrected_staleness_warning(0, corrected=False) is None
  assert actors.uncorrected_staleness_warning(2, corrected=True) is None
  line = actors.uncorrected_staleness_warning(2, corrected=False)
  assert "\n" not in line and line.startswith("warning: rollout.max_staleness=2 ")
  assert "algo.rollout_is" in line


@pytest.mark.parametrize("correction, warned", [({}, True),
                                                 ({"algo.rollout_is": "token"}, False)])
def test_training_prints_it_before_the_first_batch(tmp_path, monkeypatch, capsys, correction,
                                                   warned):
  def collect(run, step, stream=0, params=None, newest=None):
    raise ValueError("no batch needed")
  monkeypatch.setattr(loop, "collect_batch", collect)
  overrides = dict(tiny.overrides("grpo"), **{"train.run_dir": str(tmp_path),
                                              "rollout.max_staleness": "1"}, **correction)
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                     list(overrides.items()))
  with pytest.raises(ValueError, match="no batch needed"):
    loop.train(config)
  lines = [l for l in capsys.readouterr().out.splitlines() if "rollout.max_staleness" in l]
  expected = actors.uncorrected_staleness_warning(1, corrected=False)
  assert lines == ([expected] if warned else [])

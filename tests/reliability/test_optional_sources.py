"""Data sources of optional packages under real use: a missing package is one line naming the
extra to install (as a missing wandb/mlflow is)."""
import os
import sys

import pytest

from rljax import cli
from tests.train import tiny


@pytest.mark.parametrize("preset, package, line", [
    ("reasoning_gym", "reasoning_gym", "error: data.source='reasoning_gym:...' needs "
                                       "reasoning-gym: pip install 'rljax[reasoning_gym]'"),
])
def test_a_missing_package_is_one_line_before_the_run_dir(preset, package, line, tmp_path,
                                                          monkeypatch, capsys):
  """Was: an ImportError traceback (exit 1)."""
  monkeypatch.setitem(sys.modules, package, None)  # `import <package>` raises ImportError
  run_dir = tmp_path / "run"
  with pytest.raises(SystemExit) as e:
    cli.entry(["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", f"{preset}.py"),
               f"--config.train.run_dir={run_dir}"])
  assert e.value.code == 2
  assert capsys.readouterr().err == line + "\n"
  assert not run_dir.exists()


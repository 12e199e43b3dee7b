"""Data sources of optional packages under real use: a missing package is one line naming the
extra to install (as a missing wandb/mlflow is), and the shipped verifiers demo refuses more
problems than it has instead of drawing forever."""
import os
import subprocess
import sys

import pytest

from rljax import cli
from tests.train import tiny


@pytest.mark.parametrize("preset, package, line", [
    ("verifiers", "verifiers", "error: data.source='verifiers:...' needs the verifiers library: "
                               "pip install 'rljax[verifiers]'"),
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


def test_the_demo_loader_refuses_more_problems_than_it_has():
  """Was: drawing distinct problems forever (2 x 2 x 2 = 8 with max_operand=1). In a subprocess
  with a time limit, so that the old behaviour fails instead of hanging the suite."""
  code = ("from rljax.envs import verifiers_demo\n"
          "verifiers_demo.load_arith_environment(num_examples=9, max_operand=1)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=tiny.ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=tiny.ROOT))
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "ValueError: num_examples=9 is more than the 8 distinct problems this environment has")

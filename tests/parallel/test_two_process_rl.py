"""Two processes started with jax.distributed.initialize run two RL steps and agree, and the
checkpoint they wrote together restores in a single process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.parallel.conftest import REPO, SCRIPTS, device_env, free_port


def _last_json(text):
  return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
def test_two_processes_run_rl_steps_and_checkpoint_restores(tmp_path):
  run_dir = str(tmp_path / "run")
  port = free_port()
  script = os.path.join(SCRIPTS, "two_process_rl.py")
  procs = [subprocess.Popen([sys.executable, script, str(i), str(port), run_dir],
                            env=device_env(2), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = []
  for proc in procs:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    outs.append(_last_json(out))
  a, b = outs
  assert a["process_count"] == b["process_count"] == 2 and a["devices"] == 4
  assert a["metrics"] == b["metrics"]
  assert a["param_sum"] == b["param_sum"] and a["param_abs"] == b["param_abs"]
  for key, value in a["metrics"].items():
    assert value is None or np.isfinite(value), key

  # The checkpoint written by both processes restores in this single process (one device).
  from rljax.train import evaluation
  model_cfg, params = evaluation.load_run_params(run_dir)
  import jax
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
  assert sum(x.sum() for x in leaves) == pytest.approx(a["param_sum"], rel=1e-12)
  assert sum(np.abs(x).sum() for x in leaves) == pytest.approx(a["param_abs"], rel=1e-12)

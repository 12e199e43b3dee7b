"""The packed train step on 8 simulated CPU devices equals the padded one on one device."""
import json

import pytest

from tests.parallel.conftest import run_script


@pytest.mark.slow
def test_packed_step_on_a_mesh_matches_one_padded_device():
  """(2, 2, 2) mesh, rows over data x fsdp: each packed chunk's 4 rows split over the 4 batch
  shards, the layout computed on the sharded minibatch; loss and AdamW-updated parameters as the
  padded step's on one device (tolerance as tests/parallel/test_train_step_mesh.py)."""
  out = run_script("packed_mesh.py", num_devices=8, timeout=900)
  r = [json.loads(line) for line in out.splitlines() if line.startswith("{")][-1]
  assert abs(r["loss"] - r["loss_ref"]) <= 1e-6 + 1e-5 * abs(r["loss_ref"]), r
  assert r["param_max_abs_diff"] < 1e-5, r
  assert r["moved"] > 1e-4, r
  assert 0.5 < r["fill"] <= 1.0, r

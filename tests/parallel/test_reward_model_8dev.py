"""The reward-model source on 8 simulated devices scores as on one (parameters sharded by the
partition rules, rows split over the data axes, in chunks of reward.model.batch_size)."""
import json

import pytest

from tests.parallel.conftest import run_script

MESHES = ("8,1,1", "2,2,2")


@pytest.mark.slow
def test_reward_model_on_8_devices_equals_one_device():
  out = run_script("reward_model_8dev.py", *MESHES, num_devices=8, timeout=300)
  results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  assert [r["mesh"] for r in results] == [[8, 1, 1], [2, 2, 2]], out
  for r in results:
    assert r["rows"] == 12 and r["spread"] > 0.1 and r["diff"] <= 1e-5
  sharded = results[1]  # fsdp x tensor: the weights are split, not copied
  assert sharded["q_spec"] == "P('fsdp', 'tensor')" and sharded["devices"] == 8

"""model.source='run:DIR' on a CPU split into several JAX devices (the default of `rljax train`
on a multi-core machine): the checkpoint's policy is placed on the learner's mesh, not refused
as "incompatible devices" (issue 58)."""
import json

import pytest

from tests.parallel.conftest import run_script


@pytest.mark.slow
def test_a_run_source_starts_on_a_two_device_mesh(tmp_path):
  out = json.loads(run_script("run_source_2dev.py", tmp_path, num_devices=2,
                              timeout=300).strip().splitlines()[-1])
  assert out == {"mesh_devices": 2, "state_devices": [0, 1], "same": True}

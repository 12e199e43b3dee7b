"""The sampler on a device of its own (``mesh.sampler_devices``, 1 + 1 simulated CPU devices):
the weights really travel there every step, the synchronous loop computes what the colocated
one computes on one device, to every digit, and the asynchronous loop runs on the split too."""
import json

import pytest

from rljax.runs import metrics as metrics_lib
from tests.parallel.conftest import run_script
from tests.parallel.scripts import async_placement

@pytest.mark.slow
def test_sampler_on_its_own_device(tmp_path):
  # The colocated run in this process (its one device); the two split runs in one 2-device
  # subprocess, one after the other, sharing its compiled programs and the session's
  # compilation cache (tests/xla_cache.py).
  colocated = async_placement.run(str(tmp_path / "colocated"), {})
  out = run_script("async_placement.py", str(tmp_path), "split,mesh.sampler_devices=1",
                   "split_async,mesh.sampler_devices=1,rollout.max_staleness=1",
                   num_devices=2, timeout=600)
  runs = {r["name"]: r for r in map(json.loads, filter(lambda line: line.startswith("{"),
                                                       out.splitlines()))}
  split, split_async = runs["split"], runs["split_async"]
  assert colocated["devices"] == {"sampler": [0], "learner": [0]}
  for r in (split, split_async):
    assert r["num_devices"] == 2
    assert r["devices"] == {"sampler": [1], "learner": [0]}  # disjoint: the weights moved
  param_bytes = None
  for a, b in zip(colocated["rows"], split["rows"]):
    assert a["step"] == b["step"]
    moved = {k: b.pop(k) for k in list(b) if k.startswith("weights/")}
    if "loss" in a:  # every update's weights are copied to the sampler, and timed
      assert moved["weights/sync_sec"] > 0
      param_bytes = param_bytes or moved["weights/sync_bytes"]
      assert moved["weights/sync_bytes"] == param_bytes
    assert metrics_lib.without_timing(a) == metrics_lib.without_timing(b)  # same numbers on another device
  # The tiny model's float32 weights: the parameter count x 4 bytes, one copy on one device.
  assert param_bytes == 4 * 11136
  steps = [r for r in split_async["rows"] if "loss" in r]
  assert len(steps) == 3 and all(r["async/staleness"] in (0.0, 1.0) for r in steps)
  assert all(r["weights/sync_bytes"] == param_bytes for r in steps)

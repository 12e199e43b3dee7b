"""``lora_placement.py RUN_DIR``: tiny LoRA runs with the sampler on a device of its own
(``mesh.sampler_devices=1`` of 2 simulated CPU devices), asynchronous
(``rollout.max_staleness=1``), printing as one JSON line the devices the sampler's
weights were on and the sampler / trainer log-prob records of ``tests/train/lora_checks.run``."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jax  # noqa: E402

from rljax.train import loop  # noqa: E402
from tests.train import lora_checks  # noqa: E402


def main():
  out = {"num_devices": jax.device_count()}
  real_collect = loop.collect_batch
  # Asynchronous only: its sampler takes each published adapter set on its own device (the
  # synchronous placement of full weights: tests/parallel/test_async_placement.py).
  for name, extra in (("async", {"rollout.max_staleness": "1", "train.steps": "3"}),):
    seen = set()

    def collect(run, step, stream=0, params=None, **kwargs):
      seen.update(d.id for x in jax.tree.leaves(params) for d in x.sharding.device_set)
      return real_collect(run, step, stream, params=params, **kwargs)
    loop.collect_batch = collect
    cfg = lora_checks.config(os.path.join(sys.argv[1], name),
                             {"mesh.sampler_devices": "1", **extra})
    _, records, _ = lora_checks.run(cfg, hold=name == "async")
    out[name] = {"sampler_devices": sorted(seen), "records": records}
  loop.collect_batch = real_collect
  print(json.dumps(out))


if __name__ == "__main__":
  main()

"""``async_placement.py ROOT NAME[,KEY=VALUE...] ...``: tiny GRPO runs (``rljax.train.loop.train``)
one after the other in this process, each in ``ROOT/NAME`` with its settings; prints, per run,
one JSON line: its name, the devices the sampler's weights and the learner's state were on at
every step, then the run's metrics rows. ``run`` is also called in the pytest process (one
device) for the colocated run."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jax  # noqa: E402

from rljax.config import loader as config_loader  # noqa: E402
from rljax.train import loop  # noqa: E402
from rljax.runs import metrics as metrics_lib  # noqa: E402
from tests.train import tiny  # noqa: E402


def devices(tree) -> list:
  return sorted({d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set})


def run(run_dir: str, extra: dict) -> dict:
  """One tiny 3-step GRPO run (2 minibatches) with ``extra`` settings: the devices its sampler's
  weights and its learner's state were on, the number of devices, and its metrics rows."""
  overrides = dict(tiny.overrides("grpo"), **{"train.run_dir": run_dir, "train.steps": "3",
                                               "algo.minibatches": "2"}, **extra)
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                     list(overrides.items()))
  seen = {"sampler": set(), "learner": set()}
  real_collect, real_learn = loop.collect_batch, loop.RunLearner.learn

  def collect(run, step, stream=0, params=None, **kwargs):  # kwargs: newest (inflight_chunk)
    seen["sampler"].update(devices(params))
    return real_collect(run, step, stream, params=params, **kwargs)

  def learn(self, batch):
    seen["learner"].update(devices(self.run.state))
    return real_learn(self, batch)
  loop.collect_batch, loop.RunLearner.learn = collect, learn
  try:
    loop.train(config)
  finally:  # the pytest process goes on with the real loop
    loop.collect_batch, loop.RunLearner.learn = real_collect, real_learn
  rows = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return {"devices": {k: sorted(v) for k, v in seen.items()},
          "num_devices": jax.device_count(), "rows": rows}


def main():
  root = sys.argv[1]
  for spec in sys.argv[2:]:
    name, *settings = spec.split(",")
    result = run(os.path.join(root, name), dict(s.split("=", 1) for s in settings))
    print(json.dumps({"name": name, **result}), flush=True)


if __name__ == "__main__":
  main()

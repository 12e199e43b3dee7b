"""``async_placement.py RUN_DIR [KEY=VALUE ...]``: a tiny GRPO run (``rljax.train.loop.train``)
that prints, as one JSON line, the devices the sampler's weights and the learner's state were on
at every step, then the run's metrics rows."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jax  # noqa: E402

from rljax import config_loader  # noqa: E402
from rljax.train import loop  # noqa: E402
from rljax.train import metrics as metrics_lib  # noqa: E402
from tests.train import tiny  # noqa: E402


def devices(tree) -> list:
  return sorted({d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set})


def main():
  run_dir, extra = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
  overrides = dict(tiny.overrides("grpo"), **{"train.run_dir": run_dir, "train.steps": "3",
                                               "algo.minibatches": "2"}, **extra)
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "grpo.py"),
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
  loop.train(config)
  rows = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  print(json.dumps({"devices": {k: sorted(v) for k, v in seen.items()},
                    "num_devices": jax.device_count(), "rows": rows}))


if __name__ == "__main__":
  main()

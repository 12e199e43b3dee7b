"""``run_source_2dev.py ROOT``: the policy of ``model.source='run:DIR'`` (a run checkpointed on
one device) placed on the learner's mesh of 2 simulated CPU devices, as ``rljax train`` does on
a multi-core machine (``mesh.cpu_devices``): the initial TrainState is made by the jitted
constructor with its shardings. Prints, as one JSON line, the devices the state's policy lands
on and whether it equals the saved checkpoint."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import jax  # noqa: E402

from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax.train import build  # noqa: E402
from tests.loading import runs  # noqa: E402


def main():
  root = sys.argv[1]
  saved = runs.policy_run(os.path.join(root, "first"), steps=(1,))
  config = runs.config({"model.source": f"run:{os.path.join(root, 'first')}",
                        "train.run_dir": os.path.join(root, "second")})
  model_cfg, params = build.load_policy(config, runs.TOKENIZER)
  mesh = mesh_lib.make_mesh(config.mesh)
  shapes, make = build.abstract_state(config, model_cfg)
  state = jax.jit(make, out_shardings=build.state_shardings(mesh, model_cfg, shapes))(params)
  print(json.dumps({
      "mesh_devices": int(mesh.devices.size),
      "state_devices": sorted({d.id for x in jax.tree.leaves(state.params)
                               for d in x.sharding.device_set}),
      "same": runs.same(jax.device_get(state.params), saved[1])}))


if __name__ == "__main__":
  main()

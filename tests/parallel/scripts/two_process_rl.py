"""One of two processes on localhost (2 CPU devices each) running two RL steps of a tiny preset:

  two_process_rl.py PROCESS_ID PORT RUN_DIR     (PROCESS_ID -1: a single-process reference run)

Both processes run ``rljax train`` with explicit ``dist.*`` keys on one global mesh (data=4) and
write one run directory (checkpoints from both, logs from process 0). Prints one JSON line with
the final metrics and a digest of the policy parameters.
"""
import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402

from rljax import cli  # noqa: E402
from rljax.parallel import distributed  # noqa: E402
from rljax.runs import metrics as metrics_lib  # noqa: E402
from tests.train import tiny  # noqa: E402


def main(pid: int, port: int, run_dir: str):
  extra = {"train.steps": "2", "train.checkpoint_every": "1", "rollout.prompts_per_step": "4",
           "data.num_eval": "4", "algo.minibatches": "2"}
  if pid >= 0:
    extra.update({"dist.coordinator_address": f"localhost:{port}", "dist.num_processes": "2",
                  "dist.process_id": str(pid)})
  result = cli.main(tiny.args("grpo", run_dir, extra))
  params = distributed.to_host(result["state"].params)
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
  print(json.dumps({
      "process_count": jax.process_count(), "devices": jax.device_count(),
      "metrics": metrics_lib.without_timing(result["last"]),
      "param_sum": float(sum(x.sum() for x in leaves)),
      "param_abs": float(sum(np.abs(x).sum() for x in leaves)),
  }))


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

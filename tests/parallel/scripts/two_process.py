"""One of two processes on localhost (2 CPU devices each, 4 in all), started by the test:

  two_process.py PROCESS_ID PORT

Starts through ``rljax.parallel.distributed.initialize`` with explicit keys, builds a global mesh
(data=2, fsdp=2) over both processes' devices, feeds each process's own rows, and checks that a
cross-process reduction, an all-gather and a sharded forward agree with local computation.
Prints one JSON line.
"""
import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the default; explicit here
jax.config.update("jax_default_matmul_precision", "highest")

from rljax.parallel import distributed  # noqa: E402


def main(pid: int, port: int):
  dist = {"mode": "auto", "coordinator_address": f"localhost:{port}", "num_processes": 2,
          "process_id": pid}
  method = distributed.initialize(dist)
  again = distributed.initialize(dist)  # idempotent

  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import multihost_utils

  from rljax.models import transformer
  from rljax.models.config import ModelConfig
  from rljax.parallel import mesh as mesh_lib, rules

  out = {"pid": pid, "method": method, "again": again, "process_index": jax.process_index(),
         "process_count": jax.process_count(), "devices": jax.device_count(),
         "local_devices": jax.local_device_count(), "main": distributed.is_main_process()}
  mesh = mesh_lib.make_mesh({"data": -1, "fsdp": 2, "expert": 1, "tensor": 1})
  out["mesh"] = mesh_lib.describe(mesh)

  # Each process owns half of the global batch; it builds only its own rows.
  global_rows = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  b_sh = rules.batch_sharding(mesh, 2)
  sl = distributed.process_batch_slice(8, b_sh)
  out["slice"] = [sl.start, sl.stop]
  x = distributed.host_local_to_global(global_rows[sl], mesh)
  out["global_shape"] = list(x.shape)
  total = jax.jit(jnp.sum, out_shardings=rules.replicated(mesh))(x)
  out["psum"] = float(np.asarray(total.addressable_data(0)))
  gathered = multihost_utils.process_allgather(x, tiled=True)
  out["allgather_ok"] = bool((np.asarray(gathered) == global_rows).all())

  # A sharded forward over both processes equals this process's local unsharded forward.
  cfg = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=8, model_type="llama")
  params = transformer.init_params(cfg, seed=0)  # same seed -> same values on both processes
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (8, 6)).astype(np.int32)
  mask = np.ones((8, 6), np.int32)
  p_sh = rules.param_shardings(mesh, transformer.logical_axes(cfg), transformer.param_shapes(cfg))
  sharded = rules.shard_params(params, p_sh)
  local = lambda a: jax.device_put(a, jax.local_devices()[0])
  ref = jax.jit(lambda p, t, m: transformer.logits(cfg, p, t, m))(local(params), local(tokens),
                                                            local(mask))
  fwd = jax.jit(lambda p, t, m: transformer.logits(cfg, p, t, m), in_shardings=(p_sh, b_sh, b_sh),
                out_shardings=rules.batch_sharding(mesh, 3))
  logits = fwd(sharded, distributed.host_local_to_global(tokens[sl], mesh),
               distributed.host_local_to_global(mask[sl], mesh))
  full = distributed.to_host(logits)  # collective: rows of both processes
  out["logits_diff"] = float(np.max(np.abs(full - np.asarray(ref))))
  # The same full batch on every process (e.g. after to_host) goes back with from_host.
  again = fwd(sharded, distributed.from_host(tokens, b_sh), distributed.from_host(mask, b_sh))
  out["from_host_diff"] = float(np.max(np.abs(distributed.to_host(again) - np.asarray(ref))))
  print(json.dumps(out), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]))

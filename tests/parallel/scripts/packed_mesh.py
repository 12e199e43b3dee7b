"""Run with 8 simulated CPU devices (XLA_FLAGS set by the test): one packed GRPO step (score ->
train_step, ``model.pack=True``, chunks of 4 rows of 16 tokens: ``model.forward_tokens=16`` per
data shard, data x fsdp = 4 shards) on a (2, 2, 2) mesh, and the padded step on one device.
Prints one JSON line: the loss of each, the largest parameter difference, how far the step
moved the parameters, and the packed layout's fill."""
import json
import os

import jax

jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402

from rljax import config_loader  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.models import llama, tiny_config  # noqa: E402
from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax.train import build, loop  # noqa: E402
from tests.train import tiny  # noqa: E402

assert jax.device_count() == 8, jax.devices()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
B, PW, T, VOCAB = 8, 8, 8, 40


def step(mesh_shape, pack):
  d, f, t = mesh_shape
  overrides = dict(tiny.OVERRIDES, **{
      "model.num_heads": "2", "model.num_kv_heads": "2", "model.pack": str(pack),
      "model.forward_tokens": "16" if pack else "0", "algo.kl_placement": "loss",
      "algo.entropy_coef": "0.01", "mesh.data": str(d), "mesh.fsdp": str(f),
      "mesh.tensor": str(t)})
  config = config_loader.load_config(os.path.join(ROOT, "configs", "grpo.py"),
                                     list(overrides.items()))
  mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:d * f * t])
  model_cfg = tiny_config(config.model, VOCAB)
  params = llama.init_params(model_cfg, seed=0)
  state, fns, _ = build.sharded_state_and_fns(config, model_cfg, params, mesh)
  hp = resolve(config).hparams
  rollout = tiny.synthetic_rollout(B, PW, T, VOCAB, [1, 0, 0, 1, 1, 1, 0, 0], 0)
  batch, scoring = fns.score(state, loop.to_device(rollout, mesh), hp)
  new_state, metrics = fns.train_step(state, batch, hp)
  host = jax.tree.map(np.asarray, new_state.params)
  return dict(loss=float(metrics["loss"][0]), params=host, initial=params,
              fill=float(metrics["pack/update_fill"][0]) if pack else None)


packed, padded = step((2, 2, 2), True), step((1, 1, 1), False)
diff = max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(packed["params"]),
                                                      jax.tree.leaves(padded["params"])))
moved = max(float(np.abs(a - np.asarray(b)).max()) for a, b in
            zip(jax.tree.leaves(padded["params"]), jax.tree.leaves(padded["initial"])))
print(json.dumps(dict(loss=packed["loss"], loss_ref=padded["loss"], param_max_abs_diff=diff,
                      moved=moved, fill=packed["fill"])))

"""Run with 8 simulated CPU devices (XLA_FLAGS set by the test): a tiny Qwen3-MoE placed by the
partition rules on meshes with an ``expert`` axis, its logits and the gradient of a log-prob
loss compared with one device's, for every MoE dispatch. Prints one JSON line per (dispatch,
mesh).

Arguments: meshes as ``data,fsdp,expert,tensor`` (``mesh_lib.AXES`` order; context 1).
"""
import json
import re
import sys

import jax

jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rljax.models import transformer  # noqa: E402
from rljax.models.config import ModelConfig  # noqa: E402
from rljax.parallel import mesh as mesh_lib, rules  # noqa: E402
from tests.algos.helpers import FAST_COMPILE  # noqa: E402

assert jax.device_count() == 8, jax.devices()

# 8 experts, so that expert=8 still gets one expert per device; capacity 0.5 drops 28 of the 118
# valid token-choice pairs, so the sharded queue must order them as one device does. One layer, the
# MoE one (its attention feeds the router): a dense layer's weights are placed as in every other
# mesh test (tests/parallel/scripts/sharded_8dev.py), and each layer costs every compiled program.
CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8, model_type="qwen3_moe",
                  num_experts=8, experts_per_token=2, moe_intermediate_size=16, moe_layers=(0,),
                  moe_capacity_factor=0.5)
B, S = 8, 12
MOE = "layers_0"
EXPERT_KERNELS = ("gate_proj", "up_proj", "down_proj")


def batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (B, S)).astype(np.int32)
  lengths = np.array([12, 7, 3, 9, 12, 1, 5, 10])
  mask = (np.arange(S)[None, :] >= S - lengths[:, None]).astype(np.int32)
  return tokens, mask


def loss_and_logits(cfg):
  """``(loss, (logits, routes, dropped))``: the mean log-prob of the next tokens plus the
  load-balancing loss, so the router gets gradient from both."""
  def fn(params, tokens, mask):
    hidden, model, moe = transformer.forward_with_routes(cfg, params, tokens, mask)
    logits = model.logits(hidden).astype(jnp.float32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None],
                               axis=-1)[..., 0]
    m = (mask[:, :-1] * mask[:, 1:]).astype(jnp.float32)
    loss = -(logp * m).sum() / m.sum() + 0.01 * moe.aux_loss
    return loss, (logits, moe.routes, moe.dropped)
  return jax.value_and_grad(fn, has_aux=True)


def max_abs(tree):
  return max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree.leaves(tree))


def max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def all_gather_shapes(hlo: str) -> set:
  """Result shapes of every all-gather in compiled HLO (XLA combines some into tuples)."""
  shapes = set()
  for result in re.findall(r"= (.*?) all-gather(?:-start)?\(", hlo):
    shapes.update(re.findall(r"f32(\[[0-9,]+\])", result))
  return shapes


def gathered_experts(hlo: str) -> list[str]:
  """Shapes of all-gathers whose result is a whole stacked expert kernel ([E, D, F] or
  [E, F, D]): a sign that XLA runs the experts replicated instead of split."""
  e, d, f = CFG.num_experts, CFG.hidden_size, CFG.moe_intermediate_size
  return sorted(all_gather_shapes(hlo) & {f"[{e},{d},{f}]", f"[{e},{f},{d}]"})


def main(meshes):
  tokens, mask = batch()
  # One jitted init: eager init compiles each random op on its own (~4 s of this script). The
  # dispatch does not change the parameter tree, so both dispatches share the parameters.
  params = jax.jit(lambda: transformer.init_params(CFG, seed=0),
                   compiler_options=FAST_COMPILE)()
  axes, shapes = transformer.logical_axes(CFG), transformer.param_shapes(CFG)
  steps = {d: loss_and_logits(CFG.replace(moe_dispatch=d))
           for d in ("dense", "sparse", "capacity")}
  refs = {d: jax.jit(step, compiler_options=FAST_COMPILE)(params, tokens, mask)
          for d, step in steps.items()}
  for shape in meshes:
    mesh = mesh_lib.make_mesh(dict(zip(("data", "fsdp", "expert", "tensor"), shape)))
    p_sh = rules.param_shardings(mesh, axes, shapes)
    b_sh = rules.batch_sharding(mesh, 2)
    sharded = rules.shard_params(params, p_sh)
    moe = sharded[MOE]["mlp"]
    placement = {"mesh": list(shape), "fallbacks": rules.fallbacks(mesh, axes, shapes),
                 "expert_specs": {k: str(moe[k].sharding.spec) for k in EXPERT_KERNELS},
                 "expert_shards": {k: list(moe[k].addressable_shards[0].data.shape)
                                   for k in EXPERT_KERNELS},
                 "router_spec": str(moe["router"]["kernel"].sharding.spec),
                 "batch_spec": str(b_sh.spec)}
    for dispatch, step in steps.items():
      (ref_loss, (ref_logits, ref_routes, ref_dropped)), ref_grads = refs[dispatch]
      jitted = jax.jit(step, in_shardings=(p_sh, b_sh, b_sh),
                       out_shardings=((None, (rules.batch_sharding(mesh, 3), None, None)), p_sh))
      compiled = jitted.lower(sharded, tokens, mask).compile(FAST_COMPILE)
      (loss, (logits, routes, dropped)), grads = compiled(sharded, tokens, mask)
      out = dict(placement, dispatch=dispatch)
      out["logits_rel_diff"] = max_diff(logits, ref_logits) / max_abs(ref_logits)
      out["grad_rel_diff"] = max_diff(grads, ref_grads) / max_abs(ref_grads)
      out["loss_diff"] = abs(float(loss) - float(ref_loss))
      out["routes_equal"] = bool((np.asarray(routes) == np.asarray(ref_routes)).all())
      out["dropped"] = [int(dropped), int(ref_dropped)]
      # The dropless dispatches against each other, sharded against one device's dense.
      (_, (dense_logits, _, _)), dense_grads = refs["dense"]
      out["vs_dense_logits_rel_diff"] = max_diff(logits, dense_logits) / max_abs(dense_logits)
      out["vs_dense_grad_rel_diff"] = max_diff(grads, dense_grads) / max_abs(dense_grads)
      out["grad_expert_specs"] = {k: str(grads[MOE]["mlp"][k].sharding.spec)
                                  for k in EXPERT_KERNELS}
      out["gathered_experts"] = gathered_experts(compiled.as_text())
      print(json.dumps(out), flush=True)


if __name__ == "__main__":
  main([tuple(int(x) for x in arg.split(",")) for arg in sys.argv[1:]])

"""Run with 8 simulated CPU devices (XLA_FLAGS set by the test): shard a tiny model by the rules on
several meshes and compare sharded with unsharded results. Prints one JSON line per mesh."""
import json
import sys

import jax

jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from rljax.models import transformer# noqa: E402
from rljax.models.config import ModelConfig  # noqa: E402
from rljax.parallel import distributed, mesh as mesh_lib, rules  # noqa: E402

assert jax.device_count() == 8, jax.devices()

CFG = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, tie_embeddings=False,
                  model_type="qwen2")
B, S = 8, 12


def batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (B, S)).astype(np.int32)
  lengths = np.array([12, 7, 3, 9, 12, 1, 5, 10])
  mask = (np.arange(S)[None, :] >= S - lengths[:, None]).astype(np.int32)
  return tokens, mask


def loss_fn(params, tokens, mask):
  logits = transformer.logits(CFG, params, tokens, mask).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits[:, :-1])
  tgt = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  m = (mask[:, :-1] * mask[:, 1:]).astype(jnp.float32)
  return -(tgt * m).sum() / m.sum()


def update(tx):
  def step(params, opt_state, tokens, mask):
    grads = jax.grad(loss_fn)(params, tokens, mask)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, grads
  return step


def max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main(meshes):
  params = transformer.init_params(CFG, seed=0)
  axes = transformer.logical_axes(CFG)
  tokens, mask = batch()
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
  dev0 = jax.devices()[0]

  # Unsharded references on one device.
  p0 = jax.device_put(params, dev0)
  ref_logits = jax.jit(lambda p, t, m: transformer.logits(CFG, p, t, m))(p0, tokens, mask)
  o0 = jax.jit(tx.init)(p0)
  ref_params = ref_opt = ref_grads = None
  cache0 = transformer.init_cache(CFG, B, S)
  pos = transformer.positions_from_mask(mask)
  prefill = lambda p, t, ps, c, m: transformer.cached_step(CFG, p, t, ps, c, 0, m)
  ref_hidden, ref_cache = jax.jit(prefill)(p0, tokens, pos, cache0, mask)

  for shape, check_update in meshes:
    data, fsdp, tensor = shape  # these dense-model meshes leave the expert axis at 1
    mesh = mesh_lib.make_mesh(dict(data=data, fsdp=fsdp, expert=1, tensor=tensor))
    out = {"mesh": list(shape)}
    p_sh = rules.param_shardings(mesh, axes, transformer.param_shapes(CFG))
    sharded = rules.shard_params(params, p_sh)
    # 1. every parameter is placed as the rules say.
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(sharded)[0]:
      ax = axes
      for k in path:
        ax = ax[k.key]
      want = rules.logical_to_spec(ax, leaf.shape, mesh)
      got = leaf.sharding
      if not (got.spec == want and got.mesh.shape == mesh.shape
              and leaf.addressable_shards[0].data.shape == got.shard_shape(leaf.shape)):
        bad.append(f"{jax.tree_util.keystr(path)} {got.spec} != {want}")
    out["param_bad"] = bad
    out["fallbacks"] = rules.fallbacks(mesh, axes, transformer.param_shapes(CFG))
    out["q_spec"] = str(sharded["layers_0"]["self_attn"]["q_proj"]["kernel"].sharding.spec)

    # 2. AdamW state mirrors the parameters.
    o_shapes = jax.eval_shape(tx.init, sharded)
    o_sh = rules.opt_state_shardings(mesh, o_shapes, p_sh, transformer.param_shapes(CFG))
    opt_state = jax.jit(tx.init, out_shardings=o_sh)(sharded)
    adam = opt_state[1][0]
    opt_bad = []
    for moments in (adam.mu, adam.nu):
      for (path, m), p in zip(jax.tree_util.tree_flatten_with_path(moments)[0],
                              jax.tree.leaves(sharded)):
        if m.sharding.spec != p.sharding.spec:
          opt_bad.append(f"{jax.tree_util.keystr(path)} {m.sharding.spec} != {p.sharding.spec}")
    if adam.count.sharding.spec != jax.sharding.PartitionSpec():
      opt_bad.append("count not replicated")
    out["opt_bad"] = opt_bad

    # 3. sharded forward == unsharded forward.
    b_sh = rules.batch_sharding(mesh, 2)
    fwd = jax.jit(lambda p, t, m: transformer.logits(CFG, p, t, m),
                  in_shardings=(p_sh, b_sh, b_sh), out_shardings=rules.batch_sharding(mesh, 3))
    logits = fwd(sharded, tokens, mask)
    out["logits_diff"] = max_diff(logits, ref_logits)
    out["logits_spec"] = str(logits.sharding.spec)

    # 4. one AdamW step, sharded == unsharded (the shape of a train step); compiling a backward
    #    pass is the slow part on CPU, so only for the meshes asked.
    if check_update:
      if ref_params is None:
        ref_params, ref_opt, ref_grads = jax.jit(update(tx))(p0, o0, tokens, mask)
      step = jax.jit(update(tx), in_shardings=(p_sh, o_sh, b_sh, b_sh),
                     out_shardings=(p_sh, o_sh, p_sh), donate_argnums=(0, 1))
      new_params, new_opt, grads = step(sharded, opt_state, tokens, mask)
      scale = max(float(np.max(np.abs(np.asarray(g)))) for g in jax.tree.leaves(ref_grads))
      out["grad_rel_diff"] = max_diff(grads, ref_grads) / scale
      out["opt_diff"] = max_diff(new_opt, ref_opt)
      out["update_diff"] = max_diff(new_params, ref_params)
      out["updated_sharding_ok"] = all(
          a.sharding.spec == b.spec for a, b in zip(jax.tree.leaves(new_params),
                                                    jax.tree.leaves(p_sh)))

    # 5. KV-cache prefill with the cache sharded by the rules.
    c_sh = rules.cache_shardings(mesh, cache0)
    out["cache_spec"] = str(c_sh[0][0].spec)
    pf = jax.jit(prefill, in_shardings=(p_sh, b_sh, b_sh, c_sh, b_sh),
                 out_shardings=(rules.batch_sharding(mesh, 3), c_sh))
    hidden, cache = pf(rules.shard_params(params, p_sh), tokens, pos,
                       jax.device_put(cache0, c_sh), mask)
    out["prefill_diff"] = max(max_diff(hidden, ref_hidden), max_diff(cache, ref_cache))

    # 6. data feeding: a single process owns every row.
    out["rows"] = distributed.process_batch_rows(B, b_sh).tolist()
    g = distributed.host_local_to_global(tokens, mesh)
    out["feed_ok"] = bool((np.asarray(g) == tokens).all()) and g.sharding.spec == b_sh.spec
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
  # Meshes as "data,fsdp,tensor". "2,2,2" checks placement, forward and prefill; "2,2,2+update"
  # also one AdamW step.
  meshes = [(tuple(int(x) for x in arg.split("+")[0].split(",")), arg.endswith("+update"))
            for arg in sys.argv[1:]]
  main(meshes)

"""Run with 8 simulated CPU devices (XLA_FLAGS set by the test): one rljax GRPO train_step and a
greedy sampling run on several (data, fsdp, tensor) meshes, compared with a 1-device mesh.

Arguments: ``d,f,t`` a train mesh, ``sd,f,t`` a sampling mesh, ``scand,f,t`` a train mesh with
``model.scan_layers=True`` and 2 layers (compared with the 1-device unrolled 2-layer step),
``mbd,f,t`` a train mesh whose step takes two minibatches (compared with the 1-device step of
two minibatches), ``lorad,f,t`` rank-4 adapters, ``packd,f,t`` packed forwards
(``model.pack=True``, chunks of ``model.forward_tokens`` = 16 tokens per data shard; compared
with the padded 1-device step). Prints one JSON line per mesh ("kind": "train" (with its
"minibatches"), "train_scan", "train_lora", "train_pack" or "sample").
"""
import json
import os
import sys

import jax

jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402

from tests.train import tiny  # noqa: E402
from rljax.config import loader as config_loader  # noqa: E402
from rljax.data.tokenizer import load_tokenizer  # noqa: E402
from rljax.models import transformer, tiny_config# noqa: E402
from rljax.parallel import mesh as mesh_lib, rules  # noqa: E402
from rljax.rollout import left_pad  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.train import build, loop  # noqa: E402

assert jax.device_count() == 8, jax.devices()

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
B, PW, T = 8, 8, 8
TOK = load_tokenizer("char")
VOCAB = TOK.vocab_size


def config_for(mesh, scan_layers=False, layers=1, minibatches=1, lora_rank=0, pack=False):
  d, f, t = mesh
  # Packed: a chunk of 16 tokens per data shard; data x fsdp = 4 shards on (2, 2, 2) make a
  # chunk of 4 rows of 16 (the synthetic rows hold 2-16 tokens).
  overrides = {"model.pack": "True", "model.forward_tokens": "16"} if pack else {}
  overrides |= {
      "model.lora.rank": str(lora_rank),
      "model.scan_layers": str(scan_layers), "model.num_layers": str(layers),
      # 4 query and 4 kv heads: both divide tensor=4, so (1, 2, 4) really splits the heads.
      "model.hidden_size": "32", "model.intermediate_size": "64",
      "model.num_heads": "4", "model.num_kv_heads": "4",
      "rollout.max_new_tokens": str(T), "rollout.prompts_per_step": "2",
      "rollout.group_size": "4", "optim.lr": "1e-3",
      "algo.minibatches": str(minibatches), "algo.micro_batches": "1", "algo.epochs": "1",
      "algo.kl_placement": "loss", "algo.entropy_coef": "0.01",
      "mesh.data": str(d), "mesh.fsdp": str(f), "mesh.tensor": str(t),
  }
  return config_loader.load_config(os.path.join(ROOT, "configs", "algos", "grpo.py"),
                                   list(overrides.items()))


def rollout_arrays(seed=0):
  # Both groups have a reward spread.
  return tiny.synthetic_rollout(B, PW, T, VOCAB, [1, 0, 0, 1, 1, 1, 0, 0], seed)


def devices_for(mesh):
  n = mesh[0] * mesh[1] * mesh[2]
  return jax.devices()[:n]


def model_config(config):
  return tiny_config(config.model, VOCAB, eos_token_id=TOK.eos_id, pad_token_id=TOK.pad_id)


def spec(sh):
  return str(sh.spec)


def train_once(mesh_shape, scan_layers=False, layers=1, minibatches=1, lora_rank=0, pack=False):
  config = config_for(mesh_shape, scan_layers, layers, minibatches, lora_rank, pack)
  mesh = mesh_lib.make_mesh(config.mesh, devices_for(mesh_shape))
  model_cfg = model_config(config)
  params = transformer.init_params(model_cfg, seed=0)
  state, fns, sharding = build.sharded_state_and_fns(config, model_cfg, params, mesh)
  hp = resolve(config).hparams
  batch, _ = fns.score(state, loop.to_device(rollout_arrays(), mesh), hp)
  # One update per batch: old_logp is None (the loss's forward gives it, ratio 1).
  assert (batch.old_logp is None) == (minibatches == 1)
  # Every field of score's output must leave row-sharded as train_step's in_shardings
  # demand: the loop feeds one straight into the other, and jit rejects another sharding.
  data_sh = lambda x: rules.batch_sharding(mesh, x.ndim)  # noqa: E731
  prepare_bad = [f"{jax.tree_util.keystr(path)}: {spec(x.sharding)}" for path, x in
                 jax.tree_util.tree_leaves_with_path(batch)
                 if not x.sharding.is_equivalent_to(data_sh(x), x.ndim)]
  direct_error = None
  if prepare_bad:
    try:  # the loop's path, on a throwaway copy (train_step donates its state)
      fns.train_step(jax.tree.map(lambda x: x.copy(), state), batch, hp)
    except ValueError as e:
      direct_error = str(e).splitlines()[0][:200]
    batch = jax.device_put(batch, jax.tree.map(data_sh, batch))  # work around it here
  new_state, metrics = fns.train_step(state, batch, hp)
  loss_sum, loss_count = (float(x) for x in metrics["loss"])
  # Per-device FLOPs of the executable the call used (XLA's cost model, after partitioning).
  cost = fns.train_step.lower(new_state, batch, hp).compile().cost_analysis()
  flops = (cost[0] if isinstance(cost, list) else cost)["flops"]

  # Placement after the step, against the rules directly (not via build.state_shardings).
  want = rules.param_shardings(mesh, transformer.logical_axes(model_cfg), transformer.param_shapes(model_cfg))
  param_bad = []
  for (path, x), w in zip(jax.tree_util.tree_leaves_with_path(new_state.params),
                          jax.tree.leaves(want)):
    if not x.sharding.is_equivalent_to(w, x.ndim):
      param_bad.append(f"{jax.tree_util.keystr(path)}: {spec(x.sharding)} != {spec(w)}")
  want_opt = rules.opt_state_shardings(mesh, jax.eval_shape(lambda: state.opt_state), want)
  opt_bad = []
  opt_leaves = jax.tree_util.tree_leaves_with_path(new_state.opt_state)
  want_opt_leaves = jax.tree.leaves(want_opt)
  assert len(opt_leaves) == len(want_opt_leaves)
  for (path, x), w in zip(opt_leaves, want_opt_leaves):
    if not x.sharding.is_equivalent_to(w, x.ndim):
      opt_bad.append(f"{jax.tree_util.keystr(path)}: {spec(x.sharding)} != {spec(w)}")
  # Adam moments mirror the params' placement (e.g. mu of the q kernel is split like q).
  mu_q_spec = None
  for path, x in opt_leaves:
    k = jax.tree_util.keystr(path)
    if ".mu" in k and "q_proj" in k and "kernel" in k:
      mu_q_spec = spec(x.sharding)
      break
  q_spec = None
  q_specs = {}  # q_proj's kernel and adapters (A shares the kernel's input axis, B its output)
  for path, x in jax.tree_util.tree_leaves_with_path(new_state.params):
    k = jax.tree_util.keystr(path)
    if "layers_0" in k and "q_proj" in k:
      q_specs[k.rsplit("'", 2)[-2]] = list(x.sharding.spec) + [None] * (x.ndim - len(
          x.sharding.spec))
    if "q_proj" in k and "kernel" in k and q_spec is None:
      q_spec = spec(x.sharding)
  host_params = jax.tree.map(np.asarray, new_state.params)
  moved = max(float(np.abs(a - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(host_params), jax.tree.leaves(params)))
  return dict(loss_sum=loss_sum, loss_count=loss_count, params=host_params, param_bad=param_bad,
              opt_bad=opt_bad, q_spec=q_spec, mu_q_spec=mu_q_spec, moved=moved, q_specs=q_specs,
              n_opt_leaves=len(opt_leaves), prepare_bad=prepare_bad, direct_error=direct_error,
              flops=flops,
              fill=float(metrics["pack/update_fill"][0]) if pack else None)


def sample_once(mesh_shape):
  config = config_for(mesh_shape)
  mesh = mesh_lib.make_mesh(config.mesh, devices_for(mesh_shape))
  model_cfg = model_config(config)
  params = transformer.init_params(model_cfg, seed=0)
  sh = rules.param_shardings(mesh, transformer.logical_axes(model_cfg), transformer.param_shapes(model_cfg))
  on_mesh = rules.shard_params(params, sh)
  prompts = ["1+1=", "hello", "abc", "what is 7*6?"]
  tokens, mask = left_pad([TOK.encode(p) for p in prompts], 8, TOK.pad_id)
  sampling = build.sampling_params(config, TOK, greedy=True)
  engine = build.make_engine(config, model_cfg, mesh, TOK)  # the RL loop's rollout engine
  engine.load_weights(on_mesh, 0)
  return engine.generate(tokens, mask, jax.random.key(0), sampling, 2)


def main(args):
  mesh_of = lambda a: tuple(map(int, a.split(",")))  # noqa: E731
  scan_meshes = [mesh_of(a[len("scan"):]) for a in args if a.startswith("scan")]
  # "mbM": two minibatches (the rows shuffled per epoch, then split) on mesh M.
  mb_meshes = [mesh_of(a[len("mb"):]) for a in args if a.startswith("mb")]
  # "loraM": the policy with rank-4 adapters on every projection (the base frozen) on mesh M.
  lora_meshes = [mesh_of(a[len("lora"):]) for a in args if a.startswith("lora")]
  # "packM": packed forwards on mesh M, against the padded 1-device step (the train meshes').
  pack_meshes = [mesh_of(a[len("pack"):]) for a in args if a.startswith("pack")]
  args = [a for a in args if not a.startswith(("scan", "mb", "lora", "pack"))]
  train_meshes = [mesh_of(a) for a in args if not a.startswith("s")]
  sample_meshes = [mesh_of(a[1:]) for a in args if a.startswith("s")]
  if train_meshes or scan_meshes or mb_meshes or lora_meshes or pack_meshes:
    runs = ([("train", m, False, 1, 1, 0, False) for m in train_meshes]
            + [("train_scan", m, True, 2, 1, 0, False) for m in scan_meshes]
            + [("train", m, False, 1, 2, 0, False) for m in mb_meshes]
            + [("train_lora", m, False, 1, 1, 4, False) for m in lora_meshes]
            + [("train_pack", m, False, 1, 1, 0, True) for m in pack_meshes])
    # The references: padded, unrolled, on one device.
    refs = {(layers, mb, rank): train_once((1, 1, 1), layers=layers, minibatches=mb,
                                           lora_rank=rank)
            for _, _, _, layers, mb, rank, _ in runs}
    for kind, m, scan, layers, mb, rank, pack in runs:
      r, ref = train_once(m, scan, layers, mb, rank, pack), refs[(layers, mb, rank)]
      loss_ref = ref["loss_sum"] / ref["loss_count"]
      loss = r["loss_sum"] / r["loss_count"]
      pdiff, prel = 0.0, 0.0
      for a, b in zip(jax.tree.leaves(r["params"]), jax.tree.leaves(ref["params"])):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        pdiff = max(pdiff, float(d.max()))
        prel = max(prel, float((d / (np.abs(b) + 1e-6)).max()))
      print(json.dumps(dict(
          kind=kind, mesh=list(m), minibatches=mb, loss=loss, loss_ref=loss_ref,
          loss_abs_diff=abs(loss - loss_ref), loss_rel_diff=abs(loss - loss_ref) / abs(loss_ref),
          count=r["loss_count"], count_ref=ref["loss_count"], param_max_abs_diff=pdiff,
          param_max_rel_diff=prel, moved=ref["moved"], param_bad=r["param_bad"],
          opt_bad=r["opt_bad"], q_spec=r["q_spec"], mu_q_spec=r["mu_q_spec"],
          n_opt_leaves=r["n_opt_leaves"], prepare_bad=r["prepare_bad"], q_specs=r["q_specs"],
          n_opt_leaves_ref=ref["n_opt_leaves"],
          direct_error=r["direct_error"], flops_ratio=r["flops"] / ref["flops"],
          fill=r["fill"])), flush=True)
  if sample_meshes:
    ref = sample_once((1, 1, 1))
    for m in sample_meshes:
      out = sample_once(m)
      toks, toks_ref = np.asarray(out.tokens), np.asarray(ref.tokens)
      print(json.dumps(dict(
          kind="sample", mesh=list(m), shape=list(toks.shape),
          tokens_equal=bool(np.array_equal(toks, toks_ref)),
          mismatches=int((toks != toks_ref).sum()),
          mask_equal=bool(np.array_equal(np.asarray(out.mask), np.asarray(ref.mask))),
          logp_max_diff=float(np.abs(np.asarray(out.sampler_logp)
                                     - np.asarray(ref.sampler_logp)).max()),
          lengths=np.asarray(ref.lengths).tolist(),
          distinct_tokens=int(len(np.unique(toks_ref))))), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])

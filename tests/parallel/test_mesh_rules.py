"""Mesh shapes, partition rules and start-up logic, in-process on one device (abstract meshes)."""
import os

import jax
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from rljax.models import transformer
from rljax.models.config import ModelConfig
from rljax.parallel import distributed, mesh as mesh_lib, rules
from tests.parallel.conftest import REPO

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=96, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, model_type="qwen2")


def amesh(data=1, fsdp=1, tensor=1, expert=1, context=1):
  sizes = dict(data=data, fsdp=fsdp, expert=expert, context=context, tensor=tensor)
  return AbstractMesh(tuple(sizes[a] for a in mesh_lib.AXES), mesh_lib.AXES)


# --- mesh ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,n,want", [
    (dict(data=-1, fsdp=1, expert=1, tensor=1), 8, (8, 1, 1, 1, 1)),
    (dict(data=1, fsdp=-1, expert=1, tensor=1), 8, (1, 8, 1, 1, 1)),
    (dict(data=2, fsdp=-1, expert=1, tensor=2), 8, (2, 2, 1, 1, 2)),
    (dict(data=1, fsdp=2, expert=1, tensor=-1), 8, (1, 2, 1, 1, 4)),
    (dict(data=2, fsdp=2, expert=1, tensor=2), 8, (2, 2, 1, 1, 2)),
    (dict(data=-1, fsdp=1, expert=1, tensor=1), 1, (1, 1, 1, 1, 1)),
    (dict(data=1, fsdp=-1, expert=1, tensor=1), 32, (1, 32, 1, 1, 1)),
    (dict(data=-1, fsdp=1, expert=2, tensor=1), 8, (4, 1, 2, 1, 1)),
    (dict(data=1, fsdp=2, expert=-1, tensor=1), 8, (1, 2, 4, 1, 1)),
    # mesh.context (a config without the key reads it as 1, as the ones above do)
    (dict(data=-1, fsdp=1, expert=1, context=2, tensor=2), 8, (2, 1, 1, 2, 2)),
    (dict(data=1, fsdp=2, expert=1, context=-1, tensor=1), 8, (1, 2, 1, 4, 1)),
])
def test_mesh_shape(cfg, n, want):
  assert mesh_lib.mesh_shape(cfg, n) == want


@pytest.mark.parametrize("cfg,n,match", [
    (dict(data=-1, fsdp=3, expert=1, tensor=1), 8, r"mesh\.fsdp"),
    (dict(data=-1, fsdp=1, expert=1, tensor=3), 8, r"mesh\.tensor"),
    (dict(data=-1, fsdp=1, expert=3, tensor=1), 8, r"product of mesh\.expert = 3 does not divide"),
    (dict(data=-1, fsdp=1, expert=1, context=3, tensor=1), 8,
     r"product of mesh\.context = 3 does not divide"),
    (dict(data=-1, fsdp=1, expert=0, tensor=1), 8, r"mesh\.expert must be a positive integer"),
    (dict(data=-1, fsdp=1, expert=-1, tensor=1), 8, r"mesh\.data, mesh\.expert"),
    (dict(data=-1, fsdp=-1, expert=1, tensor=1), 8, r"only one mesh axis may be -1"),
    (dict(data=2, fsdp=2, expert=1, tensor=1), 8, r"mesh has 4 devices but 8 are available"),
    (dict(data=0, fsdp=1, expert=1, tensor=1), 8, r"mesh\.data must be a positive integer or -1"),
    (dict(data=-1, fsdp=1, expert=1), 8, r"no key 'tensor'"),
    (dict(data=-1, fsdp=1, tensor=1), 8, r"no key 'expert'"),
])
def test_mesh_shape_errors_name_the_key(cfg, n, match):
  with pytest.raises((ValueError, KeyError), match=match):
    mesh_lib.mesh_shape(cfg, n)


def test_mesh_axes_are_the_mesh_config_keys():
  from rljax.config.table import KEYS
  assert (tuple(k.name[len("mesh."):] for k in KEYS if k.section == "mesh")
          == mesh_lib.AXES + ("cpu_devices",) + mesh_lib.PLACEMENT)


@pytest.mark.parametrize("overrides, cores, want", [
    ({}, 2, 2), ({}, 3, 2), ({}, 4, 4), ({}, 16, 8),  # 8 prompts x 8: at most one per prompt
    ({"rollout.prompts_per_step": "3"}, 2, 1), ({"rollout.prompts_per_step": "3"}, 4, 3),
    # 4 prompts x 2 in 4 minibatches: parts of 2 rows
    ({"rollout.prompts_per_step": "4", "rollout.group_size": "2", "algo.minibatches": "4"},
     4, 2),
    ({}, 1, 1), ({"mesh.cpu_devices": "3"}, 2, 3), ({"mesh.cpu_devices": "0"}, 2, 0),
])
def test_cpu_devices_one_per_core_that_the_rows_split_over(overrides, cores, want):
  from rljax.config import loader as config_loader
  config = config_loader.load_config(os.path.join(REPO, "configs", "algos", "grpo.py"),
                                     list(overrides.items()))
  assert mesh_lib.cpu_devices(config, cores) == want


def test_cpu_devices_left_alone_once_jax_started():
  """In this test process JAX has started: ``rljax train`` run in-process (a notebook, a test)
  keeps the devices it has."""
  from rljax.config import loader as config_loader
  jax.devices()
  config = config_loader.load_config(os.path.join(REPO, "configs", "algos", "grpo.py"))
  assert mesh_lib.start_cpu_devices(config) is None


def test_make_mesh_from_base_config():
  import ml_collections
  c = ml_collections.ConfigDict(dict(data=-1, fsdp=1, expert=1, tensor=1))
  mesh = mesh_lib.make_mesh(c)
  assert mesh.axis_names == ("data", "fsdp", "expert", "context", "tensor")
  assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "expert": 1, "context": 1,
                              "tensor": 1}
  assert "1 process" in mesh_lib.describe(mesh)


# --- rules ---------------------------------------------------------------------------------------

def test_logical_to_spec_defaults():
  m = amesh(2, 2, 2)
  assert rules.logical_to_spec(("embed", "q_heads"), (32, 64), m) == P("fsdp", "tensor")
  assert rules.logical_to_spec(("mlp", "embed"), (96, 32), m) == P("tensor", "fsdp")
  assert rules.logical_to_spec(("vocab", "embed"), (64, 32), m) == P("tensor", "fsdp")
  assert rules.logical_to_spec(("norm",), (32,), m) == P(None)
  assert rules.logical_to_spec(("embed", None), (32, 1), m) == P("fsdp", None)
  assert rules.logical_to_spec(("batch", None), (8, 5), m) == P(("data", "fsdp"), None)
  assert rules.logical_to_spec((), (), m) == P()


def test_size_one_axes_are_dropped():
  m = amesh(1, 8, 1)
  assert rules.logical_to_spec(("batch", None), (8, 5), m) == P("fsdp", None)
  assert rules.logical_to_spec(("embed", "mlp"), (32, 96), m) == P("fsdp", None)


def test_mesh_axis_used_once_per_array():
  m = amesh(1, 2, 2)
  # [B, S, D] activations: batch takes fsdp, so the width cannot use it again.
  assert rules.logical_to_spec(("batch", "length", "embed"), (4, 3, 32), m) == \
      P("fsdp", None, None)


def test_not_divisible_falls_back_and_is_reported():
  m = amesh(1, 2, 4)
  spec, notes = rules.resolve(("embed", "kv_heads"), (32, 6), m)
  assert spec == P("fsdp", None)
  assert len(notes) == 1 and notes[0].dim == 1 and notes[0].used == ()
  assert "replicated" in str(notes[0]) and "kv_heads=6" in str(notes[0])
  # A multi-axis rule keeps the longest prefix that divides: 6 rows over data=2 x fsdp=4.
  spec, notes = rules.resolve(("batch",), (6,), amesh(2, 4, 1))
  assert spec == P("data") and notes[0].used == ("data",)


def test_unknown_logical_name_and_bad_override():
  with pytest.raises(KeyError, match="no partition rule"):
    rules.logical_to_spec(("heads_typo",), (4,), amesh(1, 1, 1))
  with pytest.raises(ValueError, match="mesh axes are"):
    rules.make_rules({"embed": "model"})


def test_rules_override():
  r = rules.make_rules({"embed": None, "length": "tensor"})
  m = amesh(1, 2, 2)
  assert rules.logical_to_spec(("embed", "mlp"), (32, 96), m, r) == P(None, "tensor")
  assert rules.logical_to_spec(("batch", "length"), (4, 6), m, r) == P("fsdp", "tensor")
  assert rules.DEFAULT_RULES["embed"] == ("fsdp", "context")  # defaults untouched


def test_context_splits_weights_with_fsdp_and_the_cache_by_slot():
  """The context axis splits no batch rows: weights' model width over fsdp x context (ZeRO-3 over
  both), the KV cache's slots over context (the sampler's striped cache), rows over the batch
  axes only."""
  m = amesh(data=2, fsdp=2, context=2)
  assert rules.logical_to_spec(("vocab", "embed"), (64, 32), m) == P(None, ("fsdp", "context"))
  assert rules.logical_to_spec(("vocab", "embed"), (64, 6), m) == P(None, "fsdp")  # 6 % 4
  assert rules.logical_to_spec(("batch", None), (8, 5), m) == P(("data", "fsdp"), None)
  cache = rules.logical_to_spec(("batch", "kv_heads", "cache_length", "head_dim"), (4, 2, 16, 8), m)
  assert cache == P(("data", "fsdp"), None, "context", None)
  assert rules.context_layout(m).size == 2 and rules.context_layout(amesh(data=2)) is None


def test_param_shardings_follow_the_rules():
  m = amesh(1, 2, 4)
  axes, shapes = transformer.logical_axes(CFG), transformer.param_shapes(CFG)
  sh = rules.param_shardings(m, axes, shapes)
  assert jax.tree.structure(sh) == jax.tree.structure(shapes)
  attn = sh["layers_0"]["self_attn"]
  assert attn["q_proj"]["kernel"].spec == P("fsdp", "tensor")
  assert attn["q_proj"]["bias"].spec == P("tensor")
  assert attn["o_proj"]["kernel"].spec == P("tensor", "fsdp")
  assert sh["layers_0"]["mlp"]["down_proj"]["kernel"].spec == P("tensor", "fsdp")
  assert sh["embed_tokens"].spec == P("tensor", "fsdp")
  assert sh["norm"]["scale"].spec == P(None)
  assert rules.fallbacks(m, axes, shapes) == []
  # Per-device bytes: matrices split 8 ways, q/k/v biases 4 ways (tensor), norms replicated.
  total = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(shapes))
  norms = (2 * CFG.num_layers + 1) * CFG.hidden_size * 4
  biases = CFG.num_layers * (CFG.num_heads + 2 * CFG.num_kv_heads) * CFG.head_dim * 4
  assert rules.per_device_bytes(shapes, sh) == (total - norms - biases) // 8 + biases // 4 + norms
  # The value head: [D, 1] with (embed, None).
  vsh = rules.param_shardings(m, transformer.logical_axes(CFG, "value"), transformer.param_shapes(CFG, "value"))
  assert vsh["value_head"]["kernel"].spec == P("fsdp", None)


def test_expert_axis_splits_only_the_expert_kernels():
  """expert=2: stacked expert kernels split by expert (and fsdp/tensor as any weight), the router
  and every dense weight replicated over it, batch rows split over it like a data axis."""
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, model_type="qwen3_moe",
                    num_experts=4, experts_per_token=2, moe_intermediate_size=16, moe_layers=(1,))
  m = amesh(data=2, fsdp=2, tensor=2, expert=2)
  axes, shapes = transformer.logical_axes(cfg), transformer.param_shapes(cfg)
  sh = rules.param_shardings(m, axes, shapes)
  moe = sh["layers_1"]["mlp"]
  assert moe["gate_proj"].spec == moe["up_proj"].spec == P("expert", "fsdp", "tensor")
  assert moe["down_proj"].spec == P("expert", "tensor", "fsdp")
  assert moe["router"]["kernel"].spec == P("fsdp", None)
  uses_expert = [jax.tree_util.keystr(k) for k, v in jax.tree_util.tree_flatten_with_path(sh)[0]
                 if "expert" in jax.tree.leaves(tuple(v.spec))]
  assert uses_expert == [f"['layers_1']['mlp']['{k}']" for k in ("down_proj", "gate_proj",
                                                                 "up_proj")]
  assert rules.fallbacks(m, axes, shapes) == []
  assert rules.batch_sharding(m, 2).spec == P(("data", "fsdp", "expert"), None)
  assert rules.batch_divisor(m) == 8
  assert rules.batch_axes() == ("data", "fsdp", "expert")
  # Per device: each expert kernel holds E/2 experts of a D/2 x F/2 block.
  e, d, f = 4, 32, 16
  assert sh["layers_1"]["mlp"]["gate_proj"].shard_shape((e, d, f)) == (2, 16, 8)


def test_fallbacks_list_the_parameter():
  cfg = CFG.replace(vocab_size=50)
  lines = rules.fallbacks(amesh(1, 2, 4), transformer.logical_axes(cfg), transformer.param_shapes(cfg))
  assert lines == ["embed_tokens: dim 0 (vocab=50) not divisible by tensor=4 -> replicated",
                   "lm_head/kernel: dim 1 (vocab=50) not divisible by tensor=4 -> replicated"]


@pytest.mark.parametrize("tx", [
    optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1)),
    optax.adam(1e-3),
    optax.sgd(1e-3, momentum=0.9),
])
def test_opt_state_mirrors_params(tx):
  m = amesh(2, 2, 2)
  shapes = transformer.param_shapes(CFG)
  p_sh = rules.param_shardings(m, transformer.logical_axes(CFG), shapes)
  state = jax.eval_shape(tx.init, shapes)
  o_sh = rules.opt_state_shardings(m, state, p_sh, shapes)
  assert jax.tree.structure(o_sh) == jax.tree.structure(state)
  flat_p = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(p_sh)[0]}
  matched = 0
  for path, sh in jax.tree_util.tree_flatten_with_path(o_sh)[0]:
    key = jax.tree_util.keystr(path)
    leaf = [x for p, x in jax.tree_util.tree_flatten_with_path(state)[0]
            if jax.tree_util.keystr(p) == key][0]
    owner = [v for k, v in flat_p.items() if key.endswith(k)]
    if leaf.ndim == 0:
      assert sh.spec == P(), key
    else:
      assert owner and sh == owner[0], key
      matched += 1
  assert matched >= len(flat_p)
  # Without param_shapes the match is by path and rank/divisibility: same answer here.
  assert rules.opt_state_shardings(m, state, p_sh) == o_sh


def test_opt_state_other_shapes_replicated():
  m = amesh(1, 2, 2)
  shapes = transformer.param_shapes(CFG)
  p_sh = rules.param_shardings(m, transformer.logical_axes(CFG), shapes)
  state = jax.eval_shape(optax.adafactor(1e-3, min_dim_size_to_factor=16).init, shapes)
  o_sh = rules.opt_state_shardings(m, state, p_sh, shapes)
  for (path, x), sh in zip(jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(o_sh)):
    owner = [v for k, v in jax.tree_util.tree_flatten_with_path(shapes)[0]
             if jax.tree_util.keystr(path).endswith(jax.tree_util.keystr(k))]
    if owner and owner[0].shape != x.shape:  # factored row/column statistics
      assert sh.spec == P(), jax.tree_util.keystr(path)


def test_batch_and_cache_shardings():
  m = amesh(2, 2, 2)
  assert rules.batch_sharding(m, 2).spec == P(("data", "fsdp"), None)
  assert rules.batch_sharding(m, 1).spec == P(("data", "fsdp"))
  assert rules.batch_divisor(m) == 4
  assert rules.batch_divisor(amesh(1, 1, 8)) == 1
  cache = jax.eval_shape(lambda: transformer.init_cache(CFG, 8, 16))
  c_sh = rules.cache_shardings(m, cache)
  assert len(c_sh) == CFG.num_layers and len(c_sh[0]) == 2  # per layer (k, v) [B, G, K, Dh]
  assert c_sh[0][0].spec == P(("data", "fsdp"), "tensor", None, None)
  # 2 kv heads do not split 4 ways: replicated heads.
  assert rules.cache_shardings(amesh(1, 2, 4), cache)[1][1].spec == P("fsdp", None, None, None)
  assert rules.replicated(m).spec == P()


def test_shard_params_single_device_does_not_alias():
  mesh = mesh_lib.make_mesh(dict(data=-1, fsdp=1, expert=1, tensor=1))
  params = {"w": jax.numpy.ones((4, 8)), "b": np.zeros(8, np.float32)}
  sh = {"w": rules.logical_sharding(mesh, ("embed", "mlp"), (4, 8)), "b": rules.replicated(mesh)}
  placed = rules.shard_params(params, sh)
  assert placed["w"].sharding == sh["w"]
  jax.jit(lambda p: jax.tree.map(lambda x: x + 1, p), donate_argnums=0)(placed)
  assert not params["w"].is_deleted()  # donating the placed copy leaves the caller's arrays


# --- distributed (single process) ----------------------------------------------------------------

@pytest.fixture
def fresh_dist(monkeypatch):
  monkeypatch.setitem(distributed._STATE, "method", None)
  for key in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
              "SLURM_LOCALID", "JAX_COORDINATOR_ADDRESS", "OMPI_MCA_orte_hnp_uri"):
    monkeypatch.delenv(key, raising=False)
  return monkeypatch


def test_initialize_single_process(fresh_dist):
  dist = dict(mode="auto", coordinator_address="", num_processes=None, process_id=None)
  assert distributed.initialize(dist) == "single"
  assert distributed.initialize(dist) == "single"  # idempotent
  assert distributed.is_main_process()


def test_initialize_off(fresh_dist):
  assert distributed.initialize(dict(mode="off", coordinator_address="", num_processes=None,
                                     process_id=None)) == "off"


@pytest.mark.parametrize("dist,match", [
    (dict(mode="on", coordinator_address="", num_processes=None, process_id=None), "dist.mode"),
    (dict(mode="auto", coordinator_address="h:1", num_processes=2, process_id=None),
     "dist.process_id"),
    (dict(mode="auto", coordinator_address="h:1", num_processes=None, process_id=None),
     "dist.num_processes and dist.process_id"),
    (dict(mode="auto", coordinator_address="h:1", num_processes=2, process_id=2),
     r"dist.process_id=2 must be in \[0, dist.num_processes=2\)"),
    (dict(mode="auto", coordinator_address="", num_processes=2, process_id=0),
     "coordinator_address is empty"),
    (dict(mode="off", coordinator_address="h:1", num_processes=2, process_id=0),
     "dist.mode='off'"),
])
def test_initialize_errors_name_the_key(fresh_dist, dist, match):
  with pytest.raises(ValueError, match=match):
    distributed.initialize(dist)
  assert distributed._STATE["method"] is None


def test_detect_cluster(fresh_dist):
  assert distributed.detect_cluster() is None
  slurm = dict(SLURM_JOB_ID="7", SLURM_STEP_NODELIST="n[1-2]", SLURM_NTASKS="16",
               SLURM_PROCID="3", SLURM_LOCALID="3")
  for k, v in slurm.items():
    fresh_dist.setenv(k, v)
  assert distributed.detect_cluster() == "slurm"
  fresh_dist.setenv("SLURM_NTASKS", "1")  # a one-task allocation stays single-process
  assert distributed.detect_cluster() is None


def test_process_rows_single_process():
  mesh = mesh_lib.make_mesh(dict(data=-1, fsdp=1, expert=1, tensor=1))
  assert distributed.process_batch_slice(8) == slice(0, 8)
  assert distributed.process_batch_slice(8, rules.batch_sharding(mesh, 2)) == slice(0, 8)
  x = np.arange(12).reshape(4, 3)
  g = distributed.host_local_to_global({"a": x}, mesh)
  assert isinstance(g["a"], jax.Array) and (np.asarray(g["a"]) == x).all()
  back = distributed.to_host(g)
  assert isinstance(back["a"], np.ndarray) and (back["a"] == x).all()
  assert distributed.from_host(x, rules.batch_sharding(mesh, 2)).sharding.spec == P(None, None)

"""One rljax GRPO train_step (score -> train_step, AdamW) and greedy sampling on 8
simulated CPU devices give the same results as on a 1-device mesh, and leave parameters and
optimizer state placed by the partition rules.

Everything runs in one subprocess (tests/parallel/scripts/train_step_mesh.py); the pytest process
keeps its single CPU device.
"""
import json

import pytest

from tests.parallel.conftest import run_script

# data alone, data x fsdp x tensor, fsdp x tensor. Each mesh compiles its own step (~10 s); fsdp
# alone (1, 8, 1) is left to tests/parallel/test_sharded_8dev.py (placement, forward, prefill):
# its step splits the rows over fsdp as (2, 2, 2)'s does over data x fsdp, and its weights over
# fsdp as (1, 2, 4)'s do.
TRAIN_MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]
SAMPLE_MESHES = [(2, 2, 2)]  # data x fsdp x tensor: every axis of the sampler split
SCAN_MESH = (2, 2, 2)  # model.scan_layers=True on the mesh against the unrolled 1-device step
# The train mesh whose step takes two minibatches of 4 rows (the batch axes, data x fsdp, split
# each 4 ways), against the 1-device step of two minibatches; the other train meshes take one
# (one update per batch, the scan and LoRA cases too: its (2, 2, 2) placement is SCAN_MESH's).
MB_MESH = (2, 2, 2)
LORA_MESH = (1, 2, 4)  # rank-4 adapters: A split like its kernel's input (fsdp), B its output
PACK_MESH = (2, 2, 2)  # packed forwards, rows over data x fsdp (4 batch shards)


@pytest.fixture(scope="module")
def results():
  args = [("mb" if m == MB_MESH else "") + ",".join(map(str, m)) for m in TRAIN_MESHES]
  args += ["s" + ",".join(map(str, m)) for m in SAMPLE_MESHES]
  args += ["scan" + ",".join(map(str, SCAN_MESH)), "lora" + ",".join(map(str, LORA_MESH)),
           "pack" + ",".join(map(str, PACK_MESH))]
  out = run_script("train_step_mesh.py", *args, num_devices=8, timeout=900)
  rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  assert len(rows) == len(TRAIN_MESHES) + len(SAMPLE_MESHES) + 3, out
  return {(r["kind"], tuple(r["mesh"])): r for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", TRAIN_MESHES)
def test_train_step_matches_one_device(results, mesh):
  r = results[("train", mesh)]
  assert r["count"] == r["count_ref"]
  assert r["loss_abs_diff"] <= 1e-6 + 1e-5 * abs(r["loss_ref"]), r
  # AdamW (lr 1e-3) is kept: its first step is ~lr * sign(g), so reduction-order noise could in
  # principle flip a near-zero gradient's update; measured max |diff| 2e-7..8e-7, moves are 1e-3.
  assert r["param_max_abs_diff"] < 1e-5, r
  assert r["moved"] > 1e-4  # the step really changed the parameters: the comparison is not vacuous


@pytest.mark.slow
@pytest.mark.parametrize("mesh", TRAIN_MESHES)
def test_each_device_computes_its_share_of_the_step(results, mesh):
  """Per-device FLOPs of the compiled step (XLA's cost analysis) against one device's: every
  mesh here splits the work 8 ways (rows over data x fsdp, heads and MLP over tensor), so 1/8
  plus what stays replicated (the optimizer update, the loss's reductions): 0.15-0.17 measured.
  When the rows came out of the epoch's reordering replicated, each device computed the whole
  batch: 1.0 on (8, 1, 1), 0.21-0.33 on the others."""
  assert results[("train", mesh)]["flops_ratio"] < 0.2, results[("train", mesh)]


@pytest.mark.slow
def test_shuffled_minibatches_stay_split_over_the_devices(results):
  """Two minibatches: the rows reordered each epoch (a permutation gather) and split. The
  minibatches are the ones one device draws (same loss and update), and each device still
  computes its share of them: 0.159 of one device's FLOPs measured; 0.324 when the gathered
  rows came out replicated."""
  r = results[("train", MB_MESH)]
  assert r["minibatches"] == 2, r
  assert r["count"] == r["count_ref"]
  assert r["loss_abs_diff"] <= 1e-6 + 1e-5 * abs(r["loss_ref"]), r
  assert r["param_max_abs_diff"] < 1e-5 and r["moved"] > 1e-4, r
  assert r["flops_ratio"] < 0.2, r


@pytest.mark.slow
def test_scanned_layers_train_step_matches_unrolled_one_device(results):
  """The layers under lax.scan (stacked weights inside the step) on a (2, 2, 2) mesh: same loss
  and updated parameters as the unrolled step on one device, parameters placed by the rules."""
  r = results[("train_scan", SCAN_MESH)]
  assert r["count"] == r["count_ref"]
  assert r["loss_abs_diff"] <= 1e-6 + 1e-5 * abs(r["loss_ref"]), r
  assert r["param_max_abs_diff"] < 1e-5, r
  assert r["moved"] > 1e-4
  assert r["param_bad"] == [] and r["opt_bad"] == [], r


@pytest.mark.slow
@pytest.mark.parametrize("mesh", TRAIN_MESHES)
def test_params_and_opt_state_placed_by_rules_after_step(results, mesh):
  r = results[("train", mesh)]
  assert r["param_bad"] == [] and r["opt_bad"] == [], r
  assert r["n_opt_leaves"] > 0
  want_q = {(8, 1, 1): "P(None, None)", (2, 2, 2): "P('fsdp', 'tensor')",
            (1, 2, 4): "P('fsdp', 'tensor')"}[mesh]
  assert r["q_spec"] == want_q
  assert r["mu_q_spec"] == want_q  # Adam's first moment lies where its parameter lies


@pytest.mark.slow
@pytest.mark.parametrize("mesh", TRAIN_MESHES)
def test_score_output_feeds_train_step_directly(results, mesh):
  r = results[("train", mesh)]
  assert r["prepare_bad"] == [] and r["direct_error"] is None, (r["prepare_bad"], r["direct_error"])


@pytest.mark.slow
@pytest.mark.parametrize("mesh", SAMPLE_MESHES)
def test_greedy_sampling_matches_one_device(results, mesh):
  r = results[("sample", mesh)]
  assert r["tokens_equal"] and r["mask_equal"], r
  assert r["logp_max_diff"] < 1e-5, r


@pytest.mark.slow
def test_lora_step_matches_one_device_and_shards_adapters_like_their_kernel(results):
  """The adapters' step on (data 1, fsdp 2, tensor 4) is the 1-device step; A [D, r] is split
  over fsdp like q_proj's input axis, B [r, H*Dh] over tensor like its output axis, the rank
  replicated; the optimizer state is the adapters' only: mu and nu of the 14 factors of the one
  layer's 7 projections, and the two step counts (the full step's: of its 11 weights)."""
  r = results[("train_lora", LORA_MESH)]
  assert r["loss_abs_diff"] <= 1e-6 + 1e-5 * abs(r["loss_ref"]), r
  assert r["param_max_abs_diff"] < 1e-5 and r["moved"] > 1e-4, r
  assert r["param_bad"] == [] and r["opt_bad"] == [], r
  specs = r["q_specs"]
  assert specs["kernel"] == ["fsdp", "tensor"], specs
  assert specs["lora_a"] == ["fsdp", None] and specs["lora_b"] == [None, "tensor"], specs
  assert r["n_opt_leaves"] == r["n_opt_leaves_ref"] == 2 * 14 + 2
  assert results[("train", LORA_MESH)]["n_opt_leaves"] == 2 * 11 + 2


@pytest.mark.slow
def test_packed_step_on_a_mesh_matches_one_padded_device(results):
  """(2, 2, 2) mesh, rows over data x fsdp: each packed chunk's 4 rows split over the 4 batch
  shards, the layout computed on the sharded minibatch; loss and AdamW-updated parameters as the
  padded step's on one device."""
  r = results[("train_pack", PACK_MESH)]
  assert r["count"] == r["count_ref"]
  assert r["loss_abs_diff"] <= 1e-6 + 1e-5 * abs(r["loss_ref"]), r
  assert r["param_max_abs_diff"] < 1e-5, r
  assert r["moved"] > 1e-4, r
  assert 0.5 < r["fill"] <= 1.0, r

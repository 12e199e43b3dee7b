"""Expert parallelism on 8 simulated CPU devices: a tiny Qwen3-MoE whose expert kernels the rules
split over the ``expert`` axis computes one device's logits and gradients, for every dispatch;
the dropless ones (dense, sparse) also equal each other.

One subprocess runs every mesh (tests/parallel/scripts/expert_8dev.py); the pytest process
itself keeps its single CPU device.
"""
import json

import pytest

from tests.parallel.conftest import run_script

# (data, fsdp, expert, tensor), as rljax.parallel.mesh.AXES orders them (context 1): expert with
# fsdp (rows over two batch axes, kernels over expert x fsdp) and expert alone (one expert a
# device). Each mesh compiles every dispatch's forward and gradient in the script (~11 s); data x
# expert is left out: data is a batch axis as fsdp is (rules 'batch': data, fsdp, expert), so its
# rows split as (1, 2, 4, 1)'s, and its kernels lie as (1, 1, 8, 1)'s.
MESHES = [(1, 2, 4, 1), (1, 1, 8, 1)]
DISPATCHES = ["dense", "sparse", "capacity"]
NUM_EXPERTS = 8  # of the script's model


@pytest.fixture(scope="module")
def expert_results():
  out = run_script("expert_8dev.py", *(",".join(map(str, m)) for m in MESHES), num_devices=8,
                   timeout=600)
  results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  assert len(results) == len(DISPATCHES) * len(MESHES), out
  return {(r["dispatch"], tuple(r["mesh"])): r for r in results}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", MESHES)
def test_expert_kernels_split_over_the_expert_axis(expert_results, mesh):
  expert = mesh[2]
  # fsdp also splits the kernels' model width, as it does every weight's.
  gate = "P('expert', 'fsdp', None)" if mesh[1] > 1 else "P('expert', None, None)"
  down = "P('expert', None, 'fsdp')" if mesh[1] > 1 else "P('expert', None, None)"
  for dispatch in DISPATCHES:
    r = expert_results[(dispatch, mesh)]
    assert r["fallbacks"] == []
    assert r["expert_specs"] == {"gate_proj": gate, "up_proj": gate, "down_proj": down}
    assert all(shape[0] == NUM_EXPERTS // expert for shape in r["expert_shards"].values())
    assert r["grad_expert_specs"] == r["expert_specs"]  # gradients stay where the experts are
    assert "expert" not in r["router_spec"]  # the router, like every dense weight, is replicated
    assert "'expert'" in r["batch_spec"]  # ... and rows are split over the axis
    # XLA brings the tokens to the experts; it never gathers a whole [E, ...] kernel (what
    # rljax plan assumes of the train step).
    assert r["gathered_experts"] == []


@pytest.mark.slow
@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("mesh", MESHES)
def test_expert_parallel_logits_and_gradients_match_one_device(expert_results, mesh, dispatch):
  r = expert_results[(dispatch, mesh)]
  assert r["logits_rel_diff"] < 1e-5
  assert r["grad_rel_diff"] < 1e-5
  assert r["loss_diff"] < 1e-5
  assert r["routes_equal"]
  if dispatch != "capacity":  # dropless: the same function, summed in another order
    assert r["vs_dense_logits_rel_diff"] < 1e-5
    assert r["vs_dense_grad_rel_diff"] < 1e-5
  sharded, single = r["dropped"]
  # Capacity's queue spans every row of the batch, sharded or not: the same pairs are dropped.
  assert sharded == single and (single > 0) == (dispatch == "capacity")

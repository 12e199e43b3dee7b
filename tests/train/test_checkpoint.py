"""Checkpointer: exact round trips, retention, atomicity, loud mismatches, any-topology restore."""
import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import rljax
from rljax.runs.checkpoint import Checkpointer, to_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(rljax.__file__)))


def make_state(scale=1.0, critic=False):
  """A train-state-like pytree: nested params, adamw state, scalars, both PRNG key forms, None."""
  params = {f"layers_{i}": {"kernel": scale * jnp.arange(6.0).reshape(2, 3) + i,
                            "bias": jnp.full((3,), scale * i, jnp.float32)} for i in (0, 2, 10)}
  params["embed_tokens"] = scale * jnp.ones((4, 2), jnp.bfloat16)
  return {
      "params": params,
      "opt_state": optax.adamw(1e-3).init(params),
      "critic_params": {"value_head": {"kernel": jnp.ones((2, 1))}} if critic else None,
      "ref_params": None,
      "step": jnp.asarray(7, jnp.int32),
      "kl_coef": jnp.asarray(0.04, jnp.float32),
      "rng": jax.random.PRNGKey(3),  # raw uint32[2] key
      "typed_rng": jax.random.key(5),  # typed key<fry>
  }


def abstract_of(state, sharding=None):
  """ShapeDtypeStructs (with a sharding) as the trainer builds them from jax.eval_shape."""
  sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shapes = jax.eval_shape(lambda: state)
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)


def assert_same_tree(a, b):
  """Same structure (dict keys included), dtypes and values; typed keys compared by key data."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  unwrap = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(unwrap(x)), np.asarray(unwrap(y)))


def test_round_trip_exact(tmp_path):
  state = make_state()
  extra = {"data": {"epoch": 1, "position": 17}, "config": {"algo": {"advantage": "grpo"}},
           "metrics": {"reward_mean": [0.1, np.float32(0.25)], "nan": float("nan")}}
  with Checkpointer(tmp_path / "ckpt", keep=2) as ckpt:
    assert ckpt.latest_step() is None
    assert ckpt.save(7, state, extra)
    # The state may be donated right after save returns: the arrays were already copied to host.
    jax.tree.map(lambda x: x.delete(), state)
    restored, restored_extra = ckpt.restore(7, abstract_of(make_state()))
  assert_same_tree(restored, make_state())
  # Keys come back exactly (in sorted order, as after any jax tree transformation).
  assert set(restored["params"]) == {"layers_0", "layers_2", "layers_10", "embed_tokens"}
  assert restored["critic_params"] is None and restored["ref_params"] is None
  assert jnp.issubdtype(restored["typed_rng"].dtype, jax.dtypes.prng_key)
  assert restored_extra["data"] == extra["data"] and restored_extra["config"] == extra["config"]
  assert restored_extra["metrics"]["reward_mean"] == [0.1, 0.25]
  assert np.isnan(restored_extra["metrics"]["nan"])


def test_keep_latest_and_reopen(tmp_path):
  directory = tmp_path / "ckpt"
  with Checkpointer(directory, keep=2) as ckpt:
    for step in (1, 2, 3, 4):
      assert ckpt.save(step, make_state(scale=step), {"step": step})
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4]
    assert sorted(os.listdir(directory)) == ["3", "4"]
    # Saving a step again is a no-op (the final save after a periodic one at the same step).
    assert not ckpt.save(4, make_state(scale=4), {"step": 4}, force=True)
    # An older step than the latest would be shadowed by the stale newer one on resume.
    with pytest.raises(ValueError, match="newer checkpoint 4"):
      ckpt.save(2, make_state(), {})
  with Checkpointer(directory, keep=2) as ckpt:
    assert ckpt.latest_step() == 4
    state, extra = ckpt.restore(None, abstract_of(make_state()))
  assert extra == {"step": 4}
  assert_same_tree(state, make_state(scale=4))


def test_partial_checkpoints_are_ignored(tmp_path):
  directory = tmp_path / "ckpt"
  with Checkpointer(directory, keep=3) as ckpt:
    ckpt.save(5, make_state(), {"step": 5})
  # A killed save leaves orbax's temporary directory; an interrupted copy (or a file system
  # without atomic rename) leaves a step directory without the commit file.
  os.makedirs(directory / "6.orbax-checkpoint-tmp-1234" / "state")
  os.makedirs(directory / "9" / "state")
  with open(directory / "9" / "state" / "garbage", "w") as f:
    f.write("half a tensor")
  with Checkpointer(directory, keep=3) as ckpt:
    assert ckpt.latest_step() == 5
    assert ckpt.all_steps() == [5]
    with pytest.raises(FileNotFoundError):
      ckpt.restore(9, abstract_of(make_state()))
    _, extra = ckpt.restore(None, abstract_of(make_state()))
    assert extra == {"step": 5}
    # Saving step 9 moves the incomplete directory aside (kept for a post-mortem) and succeeds.
    assert ckpt.save(9, make_state(scale=9), {"step": 9}, force=True)
    assert ckpt.latest_step() == 9
  names = os.listdir(directory)
  assert not any("orbax-checkpoint-tmp" in n for n in names)  # cleaned up on open
  assert any(n.startswith("9.incomplete-") for n in names)


def test_mismatched_trees_fail_loudly(tmp_path):
  with Checkpointer(tmp_path / "ckpt", keep=1) as ckpt:
    ckpt.save(1, make_state(critic=False), {})
    # critic enabled on resume: orbax alone would hand back None for the critic.
    with pytest.raises(ValueError, match="critic_params/value_head/kernel"):
      ckpt.restore(1, abstract_of(make_state(critic=True)))
    # A subtree set to None in the abstract state would be silently dropped.
    abstract = abstract_of(make_state())
    abstract["opt_state"] = None
    with pytest.raises(ValueError, match="in the checkpoint but None"):
      ckpt.restore(1, abstract)
    with pytest.raises(ValueError, match="need a sharding"):
      ckpt.restore(1, jax.eval_shape(make_state))
    with pytest.raises(TypeError, match=r"extra\.data: dict keys must be strings"):
      ckpt.save(2, make_state(), {"data": {3: "x"}})
  with pytest.raises(ValueError, match="keep_checkpoints"):
    Checkpointer(tmp_path / "other", keep=0)


def test_to_json_converts_numbers_and_arrays():
  out = to_json({"a": np.int64(3), "b": (1, jnp.float32(2.5)), "c": np.arange(3), "d": None})
  assert out == {"a": 3, "b": [1, 2.5], "c": [0, 1, 2], "d": None}
  json.dumps(out)


# Saves a state sharded over 2 processes x 2 CPU devices; the test process (one device) restores.
_WORKER = r"""
import sys
import jax
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]))
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from rljax.runs.checkpoint import Checkpointer
mesh = jax.make_mesh((4,), ("data",))
kernel = np.arange(32.0, dtype=np.float32).reshape(8, 4)
state = {
    "params": {"layers_0": {"kernel": jax.make_array_from_callback(
        kernel.shape, NamedSharding(mesh, P("data")), lambda idx: kernel[idx])}},
    "step": jax.make_array_from_callback((), NamedSharding(mesh, P()),
                                         lambda idx: np.int32(5)),
    "critic_params": None,
}
with Checkpointer(sys.argv[3], keep=2) as ckpt:
  ckpt.save(5, state, {"process_count": jax.process_count()})
"""


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_process_checkpoint_restores_in_one_process(tmp_path):
  directory = str(tmp_path / "ckpt")
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
             XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  address = f"localhost:{_free_port()}"
  workers = [subprocess.Popen([sys.executable, "-c", _WORKER, address, str(i), directory],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(2)]
  for worker in workers:
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, out.decode()[-3000:]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = {"params": {"layers_0": {"kernel": jax.ShapeDtypeStruct((8, 4), jnp.float32,
                                                                     sharding=device)}},
              "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=device),
              "critic_params": None}
  with Checkpointer(directory, keep=2) as ckpt:
    assert ckpt.latest_step() == 5
    state, extra = ckpt.restore(5, abstract)
  assert extra == {"process_count": 2}
  np.testing.assert_array_equal(np.asarray(state["params"]["layers_0"]["kernel"]),
                                np.arange(32.0).reshape(8, 4))
  assert state["params"]["layers_0"]["kernel"].sharding == device
  assert int(state["step"]) == 5 and state["critic_params"] is None


@pytest.mark.parametrize("kl_now", [True, False])
def test_a_checkpoint_from_before_transforms_owned_their_state_resumes(tmp_path, kl_now):
  """Runs checkpointed with top-level ``kl_coef`` / ``entropy_ctrl`` resume into
  ``TrainState.transforms`` (a KL coefficient the config no longer uses is dropped)."""
  from rljax.algos.entropy import EntropyCtrlState
  from rljax.learner import state as state_lib
  params = {"w": jnp.arange(3.0)}
  common = dict(step=jnp.asarray(4, jnp.int32), params=params,
                opt_state=optax.adamw(1e-3).init(params), critic_params=None,
                critic_opt_state=None, ref_params=None,
                rng=jax.random.PRNGKey(1), skipped_updates=jnp.asarray(0, jnp.int32))
  ctrl = EntropyCtrlState(jnp.asarray(0.002), jnp.asarray(0.001), jnp.asarray(0.3))
  old = dict(common, kl_coef=jnp.asarray(0.07, jnp.float32), entropy_ctrl=ctrl)
  transforms = {"entropy_ctrl": ctrl}
  if kl_now:
    transforms["kl_coef"] = {"coef": jnp.asarray(0.0, jnp.float32)}
  current = state_lib.TrainState(**common, transforms=transforms)
  with Checkpointer(tmp_path / "ckpt", keep=2) as ckpt:
    ckpt.save(4, old, {"data": {}})
    ckpt.wait()
    with pytest.raises(ValueError, match="does not match the state being restored"):
      ckpt.restore(4, abstract_of(current))  # without the migration: refused, not set aside
    step, state, _ = ckpt.restore_latest(abstract_of(current), migrate=state_lib.legacy_layout)
  assert step == 4 and isinstance(state, state_lib.TrainState)
  assert float(state.transforms["entropy_ctrl"].coef) == pytest.approx(0.002)
  assert ("kl_coef" in state.transforms) == kl_now
  if kl_now:
    assert float(state.transforms["kl_coef"]["coef"]) == pytest.approx(0.07)
  np.testing.assert_array_equal(np.asarray(state.params["w"]), [0.0, 1.0, 2.0])

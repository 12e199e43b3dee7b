"""A new transform is one module: registered by name, its state initialised, sharded,
checkpointed and stepped, its host field carried to the device, without the trainer naming it."""
import os

import jax.numpy as jnp
import numpy as np
import pytest

from rljax import cli
from rljax.algos.losses import scalar_metric, token_metrics
from rljax.runs import metrics as metrics_lib
from rljax.transforms import TRANSFORMS, Transform, register_transform
from tests.train import tiny

NAME = "test_reward_tracker"


@pytest.fixture
def reward_tracker():
  """Keeps a running sum of the batch's mean reward (state), adds a per-row host field
  (``row_index``) and logs both from the compiled step."""
  @register_transform(NAME, order=99, reads=())
  def make(algo, hparams):
    def on_rollout(host):
      rows = np.arange(host.rollout.rewards.shape[0], dtype=np.float32)
      return host.rollout.replace(extras={**host.rollout.extras, "row_index": rows}), {}

    def on_step(state, hp, batch, metrics):
      mean = batch.rewards.mean()
      new = {"reward_sum": state["reward_sum"] + mean, "steps": state["steps"] + 1}
      return new, {"tracker/reward_sum": scalar_metric(new["reward_sum"]),
                   "tracker/steps": scalar_metric(new["steps"]),
                   "tracker/row_index": token_metrics(
                       batch.loss_mask, v=batch.extras["row_index"][:, None]
                       * jnp.ones_like(batch.loss_mask))["v"]}

    return Transform(NAME, init=lambda: {"reward_sum": jnp.zeros((), jnp.float32),
                                         "steps": jnp.zeros((), jnp.int32)},
                     on_rollout=on_rollout, on_step=on_step)
  yield
  TRANSFORMS.unregister(NAME)


@pytest.mark.slow
def test_a_transform_in_one_module_keeps_state_across_a_resume(tmp_path, reward_tracker):
  run_dir = str(tmp_path / "run")
  first = cli.main(tiny.args("grpo", run_dir, {"algo.kl_placement": "none"}))
  assert int(first["state"].transforms[NAME]["steps"]) == 2
  resumed = cli.main(tiny.args("grpo", run_dir, {"algo.kl_placement": "none",
                                                 "train.steps": "3", "train.resume": "true"}))
  records = [r for r in metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
             if "loss" in r]
  assert [r["tracker/steps"] for r in records] == [1.0, 2.0, 3.0]  # continued from the checkpoint
  np.testing.assert_allclose([r["tracker/reward_sum"] for r in records],
                             np.cumsum([r["reward_mean"] for r in records]), rtol=1e-6)
  # The host field reached the compiled step row by row (mean of the indices of valid tokens).
  assert all(0 <= r["tracker/row_index"] < 8 for r in records)
  assert int(resumed["state"].transforms[NAME]["steps"]) == 3

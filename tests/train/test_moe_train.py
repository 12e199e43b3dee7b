"""RL on the new families: a GRPO run on a tiny Qwen3 and a tiny Qwen3-MoE, and router replay."""
import json
import os

import jax
import numpy as np
import pytest

from rljax import cli, config as rljax_config, models
from rljax.rollout import SamplingParams, sample
from rljax.runs import metrics as metrics_lib
from rljax.learner import packing
from rljax.learner import step as step_lib
from tests.train import tiny


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe"])
def test_grpo_runs_on_tiny_qwen3_and_qwen3_moe(family, tmp_path):
  run_dir = str(tmp_path / family)
  extra = {"model.family": family}
  if family == "qwen3_moe":  # bf16 sampling, the sampler's experts replayed in the update
    extra.update({"model.router_replay": "R3", "rollout.dtype": "bfloat16"})
  cli.main(tiny.args("grpo", run_dir, extra))
  steps = [r for r in metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
           if "loss" in r]
  assert len(steps) == 2
  for record in steps:
    for key, value in record.items():
      assert value is None or np.isfinite(value), (key, value)
  if family == "qwen3_moe":
    with open(os.path.join(run_dir, "config.json")) as f:
      assert json.load(f)["algo"]["router_aux_coef"] == 0.001  # the checkpoint's default
    for record in steps:
      assert record["moe/route_mismatch_update"] == 0.0  # R3: the sampler's experts
      assert record["moe/dropped"] == 0.0  # the sparse dispatch (the default) drops nothing
      # E * sum_e f_e P_e >= k = 2 (equality at a uniform router), Fedus et al. eq. 4.
      assert record["moe/aux_loss"] >= 2.0 - 1e-4
      assert record["router_balance_loss"] == pytest.approx(record["moe/aux_loss"], rel=1e-5)


def _tiny_moe(**changes):
  c = rljax_config()
  c.model.update(family="qwen3_moe", hidden_size=32, intermediate_size=64, num_layers=2,
                 num_heads=4, num_kv_heads=2, moe_intermediate_size=16, num_experts=4,
                 experts_per_token=2)
  return models.tiny_config(c.model, 40, eos_token_id=1, pad_token_id=0).replace(**changes)


def test_replayed_sampler_routes_reproduce_the_sampler():
  """R3: the sampler records every fed token's experts; a teacher-forced forward that replays
  them routes exactly as the sampler did and gives its log-probs, padded or packed; R3 without
  routes fails."""
  cfg = _tiny_moe(router_replay="R3")
  # Init and forwards jitted, as in the train step: op by op, every op compiles on its own,
  # several times slower than one program.
  params = jax.jit(lambda: models.init_params(cfg, seed=1))()
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 40, (3, 6)).astype(np.int32)
  mask = np.ones_like(tokens)
  mask[0, :2] = 0
  sp = SamplingParams(max_new_tokens=5, temperature=1.0, stop_ids=(), pad_id=0)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(0), sp, group_size=2))
  routes = r.extras["sampler_routes"]
  assert routes.shape == (6, 11, 2, 2)  # [B, P + T, MoE layers, k]
  replayed = step_lib.replayed_routes(cfg, r, in_update=True)
  logp, _, moe = jax.jit(lambda p, r, routes: step_lib.policy_stats(
      cfg, p, r, chunk=8, routes=routes))(params, r, replayed)
  fed = np.concatenate([r.prompt_mask, np.pad(r.mask[:, 1:], ((0, 0), (0, 1)))], 1) > 0
  np.testing.assert_array_equal(np.asarray(moe["routes"])[fed], routes[fed])
  np.testing.assert_allclose(np.asarray(logp)[r.mask > 0], r.sampler_logp[r.mask > 0], atol=2e-5)
  # Packed (model.pack): the routes are laid out with the tokens, two sequences a row (rows
  # twice as wide as these full ones), and come back to the padded layout; dropless dispatch,
  # so a token's experts and outputs do not depend on the tokens beside it.
  _, valid = step_lib.sequence_inputs(r)
  packed = step_lib.Packed(packing.layout(valid, packing.chunk_shape(6, 2 * valid.shape[1], 2)))
  assert int(packed.layout.used_rows) == 3
  logp, _, moe = jax.jit(lambda p, r, routes: step_lib.policy_stats(
      cfg, p, r, chunk=8, split=packed, routes=routes))(params, r, replayed)
  np.testing.assert_array_equal(np.asarray(moe["routes"])[fed], routes[fed])
  np.testing.assert_allclose(np.asarray(logp)[r.mask > 0], r.sampler_logp[r.mask > 0], atol=2e-5)
  with pytest.raises(ValueError, match="sampler's routes"):
    step_lib.replayed_routes(cfg, r.replace(extras={}), in_update=True)
  with pytest.raises(ValueError, match=r"router replay needs \[B, S, MoE layers"):
    step_lib.policy_stats(cfg, params, r, chunk=8, routes=routes[:, :, :1])


@pytest.mark.parametrize("keys, named", [
    ({"model.num_experts": 8}, "model.num_experts=8"),
    ({"model.router_replay": "R3", "algo.router_aux_coef": 0.01}, "model.router_replay='R3'"),
    ({"algo.router_aux_coef": 0.01}, "algo.router_aux_coef=0.01"),
])
def test_moe_keys_on_a_dense_model_are_refused_by_name(keys, named):
  from rljax.errors import UnusedKeyError
  from rljax.train import build
  config = rljax_config()
  for key, value in keys.items():
    section, name = key.split(".")
    config[section][name] = value
  with pytest.raises(UnusedKeyError,
                     match=f"{named} is not used: .* is a llama model without MoE layers"):
    build.prepare(config)

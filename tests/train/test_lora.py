"""RL with low-rank adapters (``model.lora.rank`` > 0) through ``rljax.train.loop.train``, tiny:

- the sampler decodes the weights the trainer has: after every update the sampler's log-probs of
  a batch equal the trainer's forward under the weights of the version the batch is tagged with
  (synchronous, and asynchronous with ``rollout.max_staleness`` = 1), while they are far from the
  initial policy's (the sampler is not stuck on the base);
- the base is frozen bit for bit (the rank-0 model of the run's seed), the optimizer state is the
  adapters', there is no reference copy and the KL reference is the base forward;
- after training the adapted forward equals the rank-0 forward on ``merge_adapters``' weights;
- checkpoints hold the adapters only, and a killed run resumes to the uninterrupted run's numbers.
"""
import json
import os

import jax
import numpy as np
import pytest

from rljax.loading import pin
from rljax.config.checks import check_config
from rljax.errors import ConfigError, RunDirError, UnusedKeyError
from rljax.models import lora, transformer
from rljax.runs import checkpoint as checkpoint_lib
from rljax.train import loop
from rljax.runs import metrics as metrics_lib
from rljax.runs.checkpoint import Checkpointer
from tests.parallel.conftest import run_script
from tests.train import lora_checks

GAP = 1e-4  # float32, the factored forward vs the merged kernels: measured ~1e-6


def _records(run_dir):
  rows = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return [metrics_lib.without_timing(r) for r in rows]


def _check_sampler(records, staleness):
  assert [r["step"] for r in records] == list(range(len(records)))
  assert {r["step"] - r["version"] for r in records} <= set(range(staleness + 1))
  for r in records:
    assert r["gap"] < GAP, r
  # The last batch was sampled by trained weights, far from the base's log-probs.
  assert records[-1]["version"] >= 1 and records[-1]["base_gap"] > 100 * GAP, records


class Killed(Exception):
  pass


def test_lora_run_sampler_frozen_base_reference_and_resume(tmp_path, monkeypatch):
  run_dir = str(tmp_path / "full")
  cfg = lora_checks.config(run_dir, {"train.checkpoint_every": "1"})
  result, records, versions = lora_checks.run(cfg)
  _check_sampler(records, staleness=0)
  assert records[0]["ref_gap"] < GAP  # the KL reference is the base with the adapters off

  state = result["state"]
  base, adapters = lora.split_adapters(jax.device_get(state.params))
  want = lora_checks.initial_base(cfg)
  assert jax.tree.structure(base) == jax.tree.structure(want)
  for x, y in zip(jax.tree.leaves(base), jax.tree.leaves(want)):
    np.testing.assert_array_equal(x, y)  # frozen, bit for bit
  assert any(np.abs(b).max() > 0 for b in jax.tree.leaves(
      jax.tree.map(np.asarray, adapters)))  # B moved off zero
  assert state.ref_params is None
  mu = state.opt_state[1][0].mu  # clip_by_global_norm, then AdamW's ScaleByAdam
  assert jax.tree.structure(mu) == jax.tree.structure(adapters)

  # After training the adapted model is the rank-0 model on the merged kernels.
  model_cfg = lora_checks.model_config(cfg)
  tokens = np.random.default_rng(0).integers(3, model_cfg.vocab_size, (2, 9)).astype(np.int32)
  mask = np.ones_like(tokens)
  logits = jax.jit(transformer.logits, static_argnums=0)  # one program, not op by op
  adapted = logits(model_cfg, state.params, tokens, mask)
  merged = logits(model_cfg.base, lora.merge_adapters(state.params, model_cfg), tokens, mask)
  np.testing.assert_allclose(adapted, merged, rtol=1e-5, atol=1e-5)

  # Checkpoints hold the adapters (and their optimizer state), never the base.
  with Checkpointer(os.path.join(run_dir, "checkpoints"), keep=1, read_only=True) as ckpt:
    saved = ckpt._manager.item_metadata(2)[checkpoint_lib.STATE]
  paths = checkpoint_lib._leaf_paths(getattr(saved, "tree", saved))
  params = [p for p in paths if p.startswith("params/")]
  assert params and all("lora_" in p for p in params), params
  assert not any(p.startswith("ref_params/") for p in paths)

  # Killed during step 2 (after checkpoint 1), resumed: the uninterrupted run's numbers.
  killed_dir = str(tmp_path / "killed")
  real_collect = loop.collect_batch

  def collect_then_die(run, step, stream=0, **kwargs):
    if step == 1:
      raise Killed()
    return real_collect(run, step, stream, **kwargs)

  monkeypatch.setattr(loop, "collect_batch", collect_then_die)
  with pytest.raises(Killed):
    loop.train(lora_checks.config(killed_dir, {"train.checkpoint_every": "1"}))
  monkeypatch.setattr(loop, "collect_batch", real_collect)
  resumed = loop.train(lora_checks.config(killed_dir, {"train.checkpoint_every": "1",
                                                       "train.resume": "true"}))
  for x, y in zip(jax.tree.leaves(jax.device_get(resumed["state"].params)),
                  jax.tree.leaves(jax.device_get(state.params))):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
  full, again = _records(run_dir), _records(killed_dir)
  assert [r["step"] for r in again] == [r["step"] for r in full]
  for a, b in zip(full, again):
    assert a.keys() == b.keys()
    for key in a:
      assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), (a["step"], key)


def test_asynchronous_sampler_samples_the_published_adapters(tmp_path):
  cfg = lora_checks.config(tmp_path, {"rollout.max_staleness": "1", "train.steps": "3"})
  _, records, _ = lora_checks.run(cfg, hold=True)
  _check_sampler(records, staleness=1)
  assert any(r["step"] - r["version"] == 1 for r in records), records  # stale batches checked



@pytest.mark.slow  # a 2-device subprocess
def test_sampler_on_its_own_device_samples_the_published_adapters(tmp_path):
  out = run_script("lora_placement.py", str(tmp_path), num_devices=2, timeout=600)
  result = json.loads(out.strip().splitlines()[-1])
  assert result["num_devices"] == 2
  assert result["async"]["sampler_devices"] == [1]  # the merged weights moved to its device
  _check_sampler(result["async"]["records"], 1)
  assert any(r["step"] - r["version"] == 1 for r in result["async"]["records"])


@pytest.mark.parametrize("extra,error,match", [
    ({"model.lora.rank": "0", "model.lora.alpha": "8.0"}, UnusedKeyError,
     r"^model.lora.alpha=8.0 is not used: model.lora.rank=0 \(no adapters\)$"),
    ({"critic.enabled": "True", "critic.lr": "1e-3"}, ConfigError,
     r"^model.lora.rank=4 with critic.enabled=True: the critic is a full trainable copy"),
    ({"algo.ref_update": "ema"}, ConfigError,
     r"^model.lora.rank=4 with algo.ref_update='ema': the reference of a LoRA policy is its "
     r"frozen base"),
])
def test_bad_lora_settings_are_one_line(tmp_path, extra, error, match):
  with pytest.raises(error, match=match) as info:
    check_config(lora_checks.config(tmp_path, extra))
  assert "\n" not in str(info.value)


def test_unknown_target_and_foreign_base_are_one_line(tmp_path):
  cfg = lora_checks.config(tmp_path, {"model.lora.targets": "('q_proj','qkv_proj')"})
  with pytest.raises(ConfigError, match=r"^model.lora.targets names \['qkv_proj'\], which are "
                                        r"no projection; choose from"):
    lora_checks.model_config(cfg)
  extra = {"lora_base": pin.base_record(cfg)}
  pin.check_record(cfg, extra, "run")  # the same base: accepted
  extra["lora_base"]["source"] = "hf:/elsewhere"
  with pytest.raises(RunDirError, match=r"^run: its adapters were trained on model.source="
                                        r"'hf:/elsewhere', not on model.source='tiny'"):
    pin.check_record(cfg, extra, "run")

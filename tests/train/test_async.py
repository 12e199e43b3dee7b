"""The sampler / learner seam (rljax.train.actors): the synchronous composition is the loop it
replaced, the asynchronous one never samples with weights more than ``rollout.max_staleness``
updates old, and bad placement settings are refused by name."""
import os
import threading
import time

import jax
import numpy as np
import pytest

from rljax.config import loader as config_loader
from rljax.config.checks import ConfigError, check_config
from rljax.parallel import distributed, mesh as mesh_lib
from rljax.train import actors, build, loop
from rljax.runs import compilation_cache
from rljax.runs import metrics as metrics_lib
from rljax.runs.metrics import summarize
from tests.train import tiny

def _config(run_dir, extra=None, preset="grpo"):
  overrides = dict(tiny.overrides(preset), **{"train.run_dir": str(run_dir)}, **(extra or {}))
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", f"{preset}.py"),
                                   list(overrides.items()))


def _reference_loop(config) -> list[dict]:
  """The RL loop as it was before the seam, written out: for each step, sample with the train
  state's weights, score, update (no eval, no checkpoints: they change nothing it computes)."""
  run = build.build_run(config)
  rows = []
  try:
    for step in range(config.train.steps):
      batch, info = loop.collect_batch(run, step)
      scored, score_metrics = run.fns.score(run.state, loop.to_device(batch, run.mesh),
                                            run.algo.hparams, *run.aux_args)
      run.state, metrics = run.fns.train_step(run.state, scored, run.algo.hparams)
      metrics = summarize(distributed.to_host({**score_metrics, **metrics}))
      metrics.update(info)
      metrics["skipped_updates"] = float(distributed.to_host(run.state.skipped_updates))
      rows.append(metrics)
  finally:
    run.checkpointer.close()
    run.writer.close()
  return rows


def _step_rows(run_dir) -> list[dict]:
  rows = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return [{k: v for k, v in metrics_lib.without_timing(r).items() if k != "step"} for r in rows
          if "loss" in r]


@pytest.mark.slow  # compiles the tiny run's functions (about 25 s)
def test_sync_composition_is_the_loop_it_replaced(tmp_path):
  extra = {"train.steps": "3", "algo.minibatches": "2"}
  # Both runs read and write the session's compilation cache (tests/xla_cache.py), every program
  # as train writes them: the second compiles nothing anew.
  with compilation_cache.persistent(jax.config.jax_compilation_cache_dir):
    expected = _reference_loop(_config(tmp_path / "reference", extra))
  loop.train(_config(tmp_path / "seam", extra))
  got = _step_rows(tmp_path / "seam")
  assert len(got) == len(expected) == 3
  for a, b in zip(expected, got):
    assert a.keys() == b.keys()  # no key added to the synchronous loop's records
    for key in a:
      assert a[key] == b[key], key  # to every digit


def test_staleness_never_exceeds_the_bound(tmp_path, monkeypatch):
  """A slow learner lets the sampler run as far ahead as the bound allows; every batch is
  checked against what the learner had done when it was sampled and the weights it published."""
  bound, steps = 2, 6
  learned = [0]  # updates the learner has finished
  published = {}  # version -> checksum of the weights published
  sampled = {}  # step -> (updates done when sampling started, checksum of the weights used)
  consumed = []  # (step, version) as the learner received them
  checksum = lambda params: float(sum(np.abs(np.asarray(x, np.float64)).sum()
                                      for x in jax.tree.leaves(params)))
  real_collect, real_learn = loop.collect_batch, loop.RunLearner.learn
  real_publish = actors.AsyncSampler.publish
  real_init = actors.AsyncSampler.__init__

  def collect(run, step, stream=0, params=None, newest=None):
    sampled[step] = (learned[0], checksum(params))
    return real_collect(run, step, stream, params=params, newest=newest)

  def learn(self, batch):
    consumed.append((batch.step, batch.version))
    # Hold the update until the sampler has started as far ahead as the bound lets it (not a
    # fixed sleep, which a slow or loaded machine's sampler might not beat).
    ahead, deadline = min(batch.step + bound, steps - 1), time.monotonic() + 120
    while ahead not in sampled and time.monotonic() < deadline:
      time.sleep(0.01)
    metrics = real_learn(self, batch)
    learned[0] += 1
    return metrics

  def publish(self, params, version):
    published[version] = checksum(params)
    return real_publish(self, params, version)

  def init(self, collect, source_state, weights, params, **kwargs):
    published[kwargs["start"]] = checksum(params)
    real_init(self, collect, source_state, weights, params, **kwargs)

  monkeypatch.setattr(loop, "collect_batch", collect)
  monkeypatch.setattr(loop.RunLearner, "learn", learn)
  monkeypatch.setattr(actors.AsyncSampler, "publish", publish)
  monkeypatch.setattr(actors.AsyncSampler, "__init__", init)
  result = loop.train(_config(tmp_path, {"train.steps": str(steps),
                                         "rollout.max_staleness": str(bound)}))
  assert [s for s, _ in consumed] == list(range(steps))
  staleness = [s - v for s, v in consumed]
  assert all(0 <= x <= bound for x in staleness), staleness
  assert max(staleness) == bound  # the bound, not the learner, held the sampler back
  for step, version in consumed:
    done_then, weights_used = sampled[step]
    assert done_then >= step - bound  # never ran further ahead than the bound
    assert weights_used == published[version]  # the tag names the weights that sampled it
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
  logged = [r["async/staleness"] for r in rows if "loss" in r]
  assert logged == staleness
  positions = [r["async/data_position"] for r in rows if "loss" in r]
  assert positions == [2.0 * (s + 1) for s in range(steps)]  # P = 2 prompts per step, in order
  assert np.isfinite(result["last"]["loss"])


def test_inflight_updates_tag_every_token_with_its_weights(tmp_path, monkeypatch):
  """rollout.inflight_chunk=2 with staleness 1: before each rollout's second chunk the sampler is
  held until the learner has published the step's own weights, so the rows still decoding
  continue under them. Every token's version is then that of its chunk's weights: the batch's
  starting version in chunk 0, the step itself after; the logged token staleness agrees."""
  steps, chunk = 4, 2
  records = {}  # step -> (batch version as sampled, token versions)
  real_collect = loop.collect_batch

  def collect(run, step, stream=0, params=None, newest=None):
    assert newest is not None
    reads = []  # the version each chunk read

    def held():
      if reads and reads[0] < step:  # hold the second chunk until weights of `step` exist
        deadline = time.monotonic() + 120
        while newest()[0] < step and time.monotonic() < deadline:
          time.sleep(0.01)
      version, weights = newest()
      reads.append(version)
      return version, weights

    batch, info = real_collect(run, step, stream, params=params, newest=held)
    records[step] = (reads[0], batch.extras["token_version"].copy(), batch.mask.copy())
    return batch, info

  monkeypatch.setattr(loop, "collect_batch", collect)
  loop.train(_config(tmp_path, {"train.steps": str(steps), "rollout.max_staleness": "1",
                                "rollout.inflight_chunk": str(chunk)}))
  rows = [r for r in metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl")) if "loss" in r]
  swapped = 0
  for step, (start, version, mask) in sorted(records.items()):
    assert ((version >= 0) == (mask > 0)).all()  # -1 exactly on padding
    first, later = version[:, :chunk], version[:, chunk:]
    assert (first[first >= 0] == start).all()
    assert (later[later >= 0] == max(start, step)).all()
    swapped += int(step > start and (later >= 0).any())
    lag = step - version[version >= 0]
    assert rows[step]["async/token_staleness_max"] == lag.max()
    assert rows[step]["async/token_staleness_mean"] == pytest.approx(lag.mean())
  assert swapped >= 1  # some rollout really took new weights mid-way


def test_sampler_error_reaches_the_learner(tmp_path, monkeypatch):
  def collect(run, step, stream=0, params=None, newest=None):
    raise ValueError("verifier exploded")
  monkeypatch.setattr(loop, "collect_batch", collect)
  with pytest.raises(ValueError, match="verifier exploded"):
    loop.train(_config(tmp_path, {"rollout.max_staleness": "1"}))
  assert not [t for t in threading.enumerate() if t.name == "rljax-sampler"]


@pytest.mark.parametrize("settings, match", [
    ({"rollout.max_staleness": -1}, "rollout.max_staleness=-1"),
    ({"mesh.sampler_devices": -2}, "mesh.sampler_devices=-2"),
    ({"rollout.inflight_chunk": 2}, r"inflight_chunk=2 is not used: the synchronous loop"),
    ({"rollout.inflight_chunk": 8, "rollout.max_staleness": 1},
     r"rollout.max_new_tokens=8 is one chunk"),
    ({"rollout.inflight_chunk": 2, "rollout.max_staleness": 1, "model.router_replay": "R3"},
     r"model.router_replay='R3': the sampler's experts are not joined"),
])
def test_bad_async_settings_name_the_key(tmp_path, settings, match):
  config = _config(tmp_path)
  for key, value in settings.items():
    config_loader.set_value(config, key, value)
  with pytest.raises(ConfigError, match=match):
    check_config(config)


def test_split_devices():
  devices = ["d0", "d1", "d2", "d3"]
  assert mesh_lib.split_devices({"sampler_devices": 0, "learner_devices": 0}, devices) == (
      devices, None)
  assert mesh_lib.split_devices({"sampler_devices": 1, "learner_devices": 0}, devices) == (
      devices[:3], devices[3:])
  assert mesh_lib.split_devices({"sampler_devices": 2, "learner_devices": 1}, devices) == (
      devices[:1], devices[2:])
  with pytest.raises(ValueError, match="mesh.learner_devices=2 needs mesh.sampler_devices"):
    mesh_lib.split_devices({"sampler_devices": 0, "learner_devices": 2}, devices)
  with pytest.raises(ValueError, match="mesh.sampler_devices=4 .* 4 devices"):
    mesh_lib.split_devices({"sampler_devices": 4, "learner_devices": 0}, devices)

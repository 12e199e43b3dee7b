"""A key's declared effect drives what a resume may change, what a sweep compares and what the
SFT cold start's stamp holds (rljax.config.effects); its declared commands, which keys each command
reads. No JAX: each test takes well under a second."""
import json
import os

import pytest

import rljax
from rljax.config import declare, effects, table
from rljax.config.declare import BOOKKEEPING, RESULT, STRING, Key
from rljax.data.tasks import make_task
from rljax.errors import RunDirError
from rljax.runs import run_dir
from rljax.sweep import runner
from rljax.train import sft


def _declare(monkeypatch, key: Key) -> None:
  """``key`` added to the table for this test (the lookups read the table when asked)."""
  monkeypatch.setattr(table, "KEYS", table.KEYS + (key,))
  monkeypatch.setitem(table.KEY_BY_NAME, key.name, key)


def _resume(tmp_path, saved: dict, current: dict) -> None:
  """``run_dir.check_start`` of a resume in a directory whose config.json is ``saved``."""
  with open(tmp_path / "config.json", "w") as f:
    json.dump(saved, f)
  config = rljax.config(overrides={"train.run_dir": str(tmp_path), "train.resume": True})
  run_dir.check_start(config, current)


def test_resume_accepts_a_bookkeeping_key_declared_here_and_refuses_a_result_key(
    tmp_path, monkeypatch):
  _declare(monkeypatch, Key("train.note", "", STRING, "a note", effect=BOOKKEEPING))
  _declare(monkeypatch, Key("train.recipe", "", STRING, "what the run computes", effect=RESULT))
  saved = json.loads(rljax.config().to_json_best_effort())
  saved["train"].update(note="first", recipe="a")
  current = json.loads(json.dumps(saved))
  current["train"]["note"] = "second"
  _resume(tmp_path, saved, current)  # accepted: the note changes nothing the run computed
  current["train"]["recipe"] = "b"
  with pytest.raises(RunDirError, match=r"its config differs in train\.recipe: 'a' -> 'b'"):
    _resume(tmp_path, saved, current)
  # The same key declared as changing results is refused too.
  _declare(monkeypatch, Key("train.note", "", STRING, "a note", effect=RESULT))
  current["train"]["recipe"] = "a"
  with pytest.raises(RunDirError, match=r"train\.note: 'first' -> 'second'"):
    _resume(tmp_path, saved, current)


# The hand lists the effects replace, as they were (rljax.runs.run_dir.RESUMABLE_CHANGES,
# rljax.sweep.runner._IGNORED_CONFIG_KEYS, rljax.train.sft._UNREAD_DATA_KEYS).
RESUMABLE_CHANGES = {
    "train.steps", "train.resume", "train.resume_override", "train.run_dir", "train.progress",
    "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints", "train.export_hf",
    "train.compilation_cache", "reward.workers", "reward.timeout_s",
    "reward.max_logged_failures", "data.num_eval", "reward.max_worker_memory_mb",
    "reward.worker_max_calls", "train.preempt_grace_s", "mesh.data", "mesh.fsdp", "mesh.expert",
    "mesh.context", "mesh.tensor", "mesh.cpu_devices", "mesh.sampler_devices",
    "mesh.learner_devices", "dist.mode", "dist.coordinator_address", "dist.num_processes",
    "dist.process_id", "model.remat", "model.scan_layers", "model.logits_chunk",
    "model.forward_tokens", "model.parallel_chunks", "model.pack", "sft.out_dir",
    "train.loggers", "train.tracker_project", "train.tracker_run_name", "train.tracker_group",
    "train.tracker_tags", "train.mlflow_tracking_uri", "rm.steps", "rm.eval_every"}
SWEEP_IGNORED = {
    "train.run_dir", "train.resume", "train.progress", "reward.workers",
    "train.compilation_cache", "train.loggers", "train.tracker_project", "train.tracker_run_name",
    "train.tracker_group", "train.tracker_tags", "train.mlflow_tracking_uri"}
SFT_UNREAD_DATA = {"data.eval_seed", "data.num_eval", "data.train_seed"}


def test_the_derived_key_classes_keep_the_hand_lists_they_replace():
  names = set(table.KEY_BY_NAME)
  resumable = {n for n in names if effects.resumable(n)}
  # Every key of the old list, and the eval split's seed (it changes only what is measured, as
  # data.num_eval, which the list held).
  assert resumable == RESUMABLE_CHANGES | {"data.eval_seed"}
  ignored = {n for n in names if effects.same_result(n)}
  # A sweep now also compares runs without how they were laid out (mesh, chunking, workers and
  # their bounds) and where they checkpoint and export: a resume accepts those changes too.
  assert ignored == RESUMABLE_CHANGES - {"train.steps", "rm.steps", "train.eval_every",
                                         "rm.eval_every", "data.num_eval"}
  assert SWEEP_IGNORED <= ignored
  data = {n for n in names if n.startswith("data.")}
  assert {n for n in data if not effects.read_by("sft", n)} == SFT_UNREAD_DATA
  assert not effects.resumable("algo.advantage") and not effects.same_result("train.steps")
  assert not effects.resumable("no.such_key")  # a key an older version saved: compared


def test_the_cold_start_stamp_is_what_rljax_sft_reads():
  config = rljax.config(overrides={"model.lora.rank": 4, "data.train_seed": 3, "seed": 5})
  stamp = sft.cold_start_stamp(config)
  # The stamp as it was written by hand: every sft, model and data key but these.
  expected = {
      "sft": {k: v for k, v in config.sft.to_dict().items() if k != "out_dir"},
      "model": {k: v for k, v in config.model.to_dict().items() if k != "lora"},
      "data": {k: v for k, v in config.data.to_dict().items()
               if f"data.{k}" not in SFT_UNREAD_DATA},
      "task": sft.task_identity(make_task("arithmetic", config.data.difficulty))}
  assert stamp == expected


def test_a_sweep_compares_runs_by_their_result_keys_only():
  flat = run_dir.flatten_config(json.loads(rljax.config().to_json_best_effort()))
  laid_out = dict(flat, **{"mesh.data": 2, "model.forward_tokens": 64, "train.run_dir": "x"})
  assert runner._comparable(laid_out) == runner._comparable(flat)
  assert runner._comparable(dict(flat, **{"data.num_eval": 8})) != runner._comparable(flat)


def test_a_sweeps_cold_start_gets_only_the_overrides_rljax_sft_reads():
  spec = runner.RunSpec("a", 0, "/r", (("algo.clip_eps_high", "0.28"), ("sft.steps", "3"),
                                       ("data.train_seed", "0"), ("model.num_layers", "1")),
                        2, "/r/_sft/x")
  argv = runner.sft_argv(spec, "c.py", python="py")
  assert argv[-2:] == ("--config.sft.steps=3", "--config.model.num_layers=1")


@pytest.mark.parametrize("change,message", [
    ({"effect": "results"}, "effect 'results' is not one of"),
    ({"commands": declare.reads("train", "serve")}, r"commands \['serve', 'train'\] are not all"),
])
def test_a_key_declares_a_known_effect_and_known_commands(change, message):
  with pytest.raises(ValueError, match=message):
    declare.declare([Key("x.y", 0, declare.SIZE, "doc", **change)])

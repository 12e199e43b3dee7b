"""Checkpoint recovery: fall back past a corrupt latest checkpoint (kept aside, never deleted),
one-line errors, read-only readers, half-deleted old checkpoints; atomic SFT cold start; run-dir
locks; metric records never duplicated on resume."""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.runs import metrics as metrics_lib
from rljax.runs import run_dir as run_dir_lib
from rljax.train import sft
from rljax.runs.checkpoint import CheckpointError, Checkpointer
from tests.train.test_checkpoint import abstract_of


def _state(scale):
  return {"w": scale * jnp.arange(6.0).reshape(2, 3), "step": jnp.asarray(int(scale), jnp.int32)}


def _save_steps(directory, steps, keep=3):
  with Checkpointer(directory, keep=keep) as ckpt:
    for step in steps:
      ckpt.save(step, _state(float(step)), {"step": step})
      ckpt.wait()


def _corrupt(step_dir, metadata=True):
  """Truncate every data file of the state item (as a full disk or a torn copy would), and
  optionally break its metadata."""
  victims = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(step_dir, "state"))
             for f in files if f not in ("_METADATA", "_CHECKPOINT_METADATA")]
  for path in victims:
    with open(path, "r+b") as f:
      f.truncate(max(os.path.getsize(path) // 3, 1))
  if metadata:
    with open(os.path.join(step_dir, "state", "_METADATA"), "w") as f:
      f.write("{not json")
  return victims


@pytest.mark.parametrize("metadata", [True, False], ids=["bad-metadata", "truncated-data"])
def test_corrupt_latest_falls_back_and_is_kept_aside(tmp_path, metadata):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [2, 4])
  assert _corrupt(str(directory / "4"), metadata)
  warnings = []
  with Checkpointer(directory, keep=3) as ckpt:
    step, state, extra = ckpt.restore_latest(abstract_of(_state(0.0)), log=warnings.append)
    assert step == 2 and extra == {"step": 2}
    np.testing.assert_array_equal(np.asarray(state["w"]), 2.0 * np.arange(6.0).reshape(2, 3))
    assert len(warnings) == 1 and f"checkpoint {directory}/4 " in warnings[0]
    assert "\n" not in warnings[0] and "falling back" in warnings[0]
    # The bad one is renamed, not deleted, and step 4 can be written again.
    aside = [n for n in os.listdir(directory) if n.startswith("4.corrupt-")]
    assert len(aside) == 1 and os.path.isdir(directory / aside[0] / "state")
    assert ckpt.all_steps() == [2]
    ckpt.save(4, _state(4.0), {"step": 4})
  assert sorted(os.listdir(directory))[:2] == ["2", "4"]


def test_no_restorable_checkpoint_is_one_line(tmp_path):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [2])
  _corrupt(str(directory / "2"))
  with Checkpointer(directory, keep=3, read_only=True) as ckpt:
    with pytest.raises(CheckpointError, match=r"no checkpoint of .* restores: checkpoint .*/2 ") as info:
      ckpt.restore_latest(abstract_of(_state(0.0)), log=lambda m: None)
  assert "\n" not in str(info.value)
  assert os.path.isdir(directory / "2")  # a reader renames nothing


def test_read_only_reader_touches_nothing(tmp_path):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [2, 4])
  # A save in progress by the live run (orbax's temporary directory) and a half-deleted old one.
  os.makedirs(directory / "6.orbax-checkpoint-tmp-123" / "state")
  os.remove(directory / "2" / "commit_success.txt")
  before = sorted(os.walk(directory))
  with Checkpointer(directory, keep=1, read_only=True) as ckpt:
    assert ckpt.all_steps() == [4]  # the half-deleted 2 is ignored, the tmp save is not a step
    step, _, _ = ckpt.restore_latest(abstract_of(_state(0.0)))
    assert step == 4
    with pytest.raises(CheckpointError, match="read-only"):
      ckpt.save(8, _state(8.0), {})
  assert sorted(os.walk(directory)) == before
  with pytest.raises(CheckpointError, match="no checkpoint directory"):
    Checkpointer(tmp_path / "missing", keep=1, read_only=True)
  assert not os.path.exists(tmp_path / "missing")


def test_sft_cold_start_is_published_atomically(tmp_path):
  out = str(tmp_path / "sft")

  def write(tmp):
    with open(os.path.join(tmp, "weights"), "w") as f:
      f.write("w")
    with open(os.path.join(tmp, sft.STAMP_FILE), "w") as f:
      f.write("{}")
  # A kill between weights and stamp leaves only a temporary directory of a dead process.
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True).stdout.strip()
  leftover = tmp_path / f"sft.tmp-{dead}-1"
  os.makedirs(leftover)
  (leftover / "weights").write_text("half")
  assert not os.path.exists(out)
  sft.publish_atomically(out, write)
  assert sorted(os.listdir(out)) == sorted(["weights", sft.STAMP_FILE])
  assert sorted(os.listdir(tmp_path)) == ["sft"]  # the dead write's leftover was removed
  sft.publish_atomically(out, write)  # replacing a stale cold start leaves one directory
  assert sorted(os.listdir(tmp_path)) == ["sft"]


def test_lock_refuses_a_live_holder_and_reports_a_stale_one(tmp_path, caplog):
  run = str(tmp_path / "run")
  lock = run_dir_lib.RunLock(run)
  record = json.load(open(os.path.join(run, run_dir_lib.LOCK_FILE)))
  assert record["pid"] == os.getpid()
  with pytest.raises(run_dir_lib.RunDirError, match=f"in use by pid {os.getpid()} on host"):
    run_dir_lib.RunLock(run)
  lock.release()
  assert not os.path.exists(os.path.join(run, run_dir_lib.LOCK_FILE))
  # A holder killed with -9 leaves its lock file, but not its flock.
  code = ("import sys, os, signal; from rljax.runs import run_dir as r; r.RunLock(sys.argv[1]); "
          "os.kill(os.getpid(), signal.SIGKILL)")
  subprocess.run([sys.executable, "-c", code, run], env=dict(os.environ, PYTHONPATH=os.getcwd()))
  dead = json.load(open(os.path.join(run, run_dir_lib.LOCK_FILE)))
  assert dead["pid"] != os.getpid()
  lock = run_dir_lib.RunLock(run)
  assert lock.stale == dead
  assert f"stale lock of pid {dead['pid']}" in caplog.text
  lock.release()


def test_config_differences_list_every_changed_key():
  saved = {"optim": {"lr": 1e-3, "b2": 0.999}, "train": {"steps": 5, "run_dir": "a"},
           "algo": {"keep_pass_rate": [0.1, 0.9]}}
  current = {"optim": {"lr": 2e-3, "b2": 0.999}, "train": {"steps": 9, "run_dir": "b"},
             "algo": {"keep_pass_rate": (0.1, 0.9)}, "new": 1}
  assert run_dir_lib.config_differences(saved, current) == [
      "new: '<absent>' -> 1", "optim.lr: 0.001 -> 0.002"]
  assert run_dir_lib.config_differences(saved, current, ("optim.lr", "new")) == []


def test_resume_keeps_one_record_per_step(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  rows = [{"step": 0, "eval_accuracy": 0.1}, {"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0},
          {"step": 2, "eval_accuracy": 0.5}, {"step": 3, "loss": 3.0}]
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
    f.write('{"step": 4, "lo')  # torn by a kill
  metrics_lib.truncate_jsonl(path, keep_through=2)  # resuming from checkpoint 2
  assert metrics_lib.read_jsonl(path) == rows[:3]


def test_resume_override_names_the_changed_keys(tmp_path):
  from rljax.config import loader as config_loader
  from tests.train import tiny
  run = str(tmp_path / "run")
  base = f"{tiny.ROOT}/configs/base.py"
  saved = config_loader.load_config(base, [("train.run_dir", run)])
  os.makedirs(run)
  run_dir_lib.write_config(run, saved.to_json_best_effort())

  def start(*overrides):
    config = config_loader.load_config(base, [("train.run_dir", run), ("train.resume", "true"),
                                              *overrides])
    run_dir_lib.check_start(config, json.loads(config.to_json_best_effort()))

  start(("train.steps", "500"), ("train.eval_every", "7"))  # may change
  with pytest.raises(run_dir_lib.RunDirError, match=r"differs in algo.kl_coef: 0.04 -> 0.1; "
                                                    r"optim.lr: 1e-06 -> 0.001\."):
    start(("optim.lr", "1e-3"), ("algo.kl_coef", "0.1"))
  with pytest.raises(run_dir_lib.RunDirError, match=r"differs in algo.kl_coef"):
    start(("optim.lr", "1e-3"), ("algo.kl_coef", "0.1"), ("train.resume_override", "('optim.lr',)"))
  start(("optim.lr", "1e-3"), ("algo.kl_coef", "0.1"),
        ("train.resume_override", "('optim.lr', 'algo.kl_coef')"))

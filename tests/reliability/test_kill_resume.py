"""kill -9, SIGTERM or Ctrl-C at many points of a tiny run, then resume: the metrics equal an
uninterrupted run's.

One uninterrupted reference run (in a subprocess, paused once so that a concurrent ``train`` and a
``convert`` can be tried against it while it is live), then one chain of launches into a second
run dir, each killed at the next point by ``tests/reliability/killable.py`` and the next one
resuming it. A persistent compilation cache shared by the launches keeps each under half a minute.
"""
import ctypes
import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from rljax import cli
from rljax.runs import metrics as metrics_lib
from rljax.runs import run_dir as run_dir_lib
from tests.train import tiny

# steps=6, a checkpoint every 2 steps and only the latest kept (so every save deletes one).
EXTRA = {"model.source": "sft", "sft.steps": "4", "sft.batch_size": "8", "sft.warmup_steps": "1",
         "rollout.max_new_tokens": "24", "train.steps": "6", "train.checkpoint_every": "2",
         "train.keep_checkpoints": "1", "train.eval_every": "3", "train.export_hf": "true"}
# (kill point, what the launch runs into)
CHAIN = ["sft:2", "compile:0.3", "rollout:2", "save:1", "delete", "update:1",
         f"random:{random.Random(12).uniform(4, 12):.1f}", "export", "none", "none"]


def _args(run_dir, resume=False):
  extra = dict(EXTRA, **{"sft.out_dir": os.path.join(run_dir, "sft_cold_start")})
  if resume:
    extra["train.resume"] = "true"
  return tiny.args("grpo", run_dir, extra)


# (signal at point, the steps the launch ends at): a preemption during the eval before training,
# a rollout (the step is dropped), Ctrl-C in a rollout, an update (the step is finished), right
# after a checkpoint save started, the eval after training; then a resume to the end.
PREEMPT_CHAIN = [("term:eval:1", 0), ("term:rollout:3", 1), ("int:rollout:2", 2),
                 ("term:update:1", 3), ("term:save:1", 4), ("term:eval:1", 6), ("none", 6)]
GRACE_S = 30.0  # train.preempt_grace_s's default


def _launch(point, args, cache, wait=True):
  env = dict(os.environ, PYTHONPATH=tiny.ROOT, JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  cmd = [sys.executable, "-m", "tests.reliability.killable", point] + args
  if not wait:
    return subprocess.Popen(cmd, cwd=tiny.ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  # A session of its own: an int: point sends SIGINT to its whole process group, like Ctrl-C.
  return subprocess.run(cmd, cwd=tiny.ROOT, env=env, capture_output=True, text=True, timeout=300,
                        start_new_session=True)


def _records(run_dir):
  rows = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return [metrics_lib.without_timing(r) for r in rows]


def _assert_same_records(expected, got):
  assert [r["step"] for r in got] == [r["step"] for r in expected]
  for a, b in zip(expected, got):
    assert a.keys() == b.keys(), a["step"]
    for key in a:
      if a[key] is None:
        assert b[key] is None
      else:
        assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-6), (a["step"], key)


def _listing(root):
  return sorted(os.path.relpath(os.path.join(d, f), root)
                for d, _, files in os.walk(root) for f in files)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run, with the concurrency checks made while it was paused and live."""
  root = tmp_path_factory.mktemp("reliability")
  cache = str(root / "jax_cache")
  run_dir = str(root / "reference")
  proc = _launch("pause:2", _args(run_dir), cache, wait=False)
  checks = {}
  try:
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(run_dir, "PAUSED")):
      assert proc.poll() is None, proc.communicate()
      assert time.monotonic() < deadline
      time.sleep(0.2)
    lock = json.load(open(os.path.join(run_dir, run_dir_lib.LOCK_FILE)))
    checks["lock"] = lock["pid"] == proc.pid and lock["host"] and lock["started"] > 0
    for resume in (False, True):
      try:
        cli.main(_args(run_dir, resume=resume))
        checks[f"second train resume={resume}"] = "not refused"
      except run_dir_lib.RunDirError as e:
        checks[f"second train resume={resume}"] = str(e)
    try:
      cli.main(["convert", run_dir, run_dir])
      checks["convert RUN RUN"] = "not refused"
    except run_dir_lib.RunDirError as e:
      checks["convert RUN RUN"] = str(e)
    before = _listing(os.path.join(run_dir, "checkpoints"))
    cli.main(["convert", run_dir, str(root / "exported")])
    checks["convert left the checkpoints"] = _listing(os.path.join(run_dir, "checkpoints")) == before
    checks["exported"] = os.path.isfile(root / "exported" / "config.json")
  finally:
    open(os.path.join(run_dir, "GO"), "w").close()
    out, err = proc.communicate(timeout=300)
  checks["rc"] = proc.returncode
  checks["stderr"] = err[-3000:]
  return root, cache, run_dir, checks


@pytest.mark.slow
def test_live_run_is_locked_and_convert_leaves_it_running(reference):
  _, _, run_dir, checks = reference
  assert checks["rc"] == 0, checks["stderr"]
  assert checks["lock"]
  for resume in (False, True):
    message = checks[f"second train resume={resume}"]
    assert message.startswith(f"{run_dir} is in use by pid ") and "\n" not in message
  assert "is (inside) a run directory" in checks["convert RUN RUN"]
  assert checks["convert left the checkpoints"] and checks["exported"]
  assert not os.path.exists(os.path.join(run_dir, run_dir_lib.LOCK_FILE))  # released at exit


@pytest.mark.slow
def test_kill_anywhere_then_resume_matches_the_uninterrupted_run(reference):
  root, cache, ref_dir, _ = reference
  run_dir = str(root / "chain")
  killed, stale_reported = [], 0
  for i, point in enumerate(CHAIN):
    result = _launch(point, _args(run_dir, resume=i > 0), cache)
    if result.returncode == -9:
      assert f"KILLED {point}" in result.stderr
      killed.append(point)
    else:  # a random point past the end, or the final launches
      assert result.returncode == 0, (point, result.stderr[-3000:])
    stale_reported += "stale lock" in result.stderr
  assert len(killed) >= 8, killed
  named = [p for p in CHAIN if p != "none" and not p.startswith("random")]
  assert [p for p in killed if not p.startswith("random")] == named  # every point was reached
  assert stale_reported >= 7  # each launch after a kill reported the dead run's lock
  _assert_same_records(_records(ref_dir), _records(run_dir))
  assert os.path.isfile(os.path.join(run_dir, "hf", "config.json"))


@pytest.mark.slow
def test_resume_refusals(reference, tmp_path):
  _, _, ref_dir, _ = reference
  with pytest.raises(run_dir_lib.RunDirError, match="holds no run"):
    cli.main(_args(str(tmp_path / "misspelt"), resume=True))
  assert not os.path.exists(tmp_path / "misspelt" / "config.json")
  changed = _args(ref_dir, resume=True) + ["--config.optim.lr=0.5", "--config.seed=3"]
  with pytest.raises(run_dir_lib.RunDirError,
                     match=r"differs in optim.lr: 0.001 -> 0.5; seed: 0 -> 3.*resume_override"):
    cli.main(changed)
  with pytest.raises(run_dir_lib.RunDirError, match="train.steps=4 is below the latest "
                                                    "checkpoint 6"):
    cli.main(_args(ref_dir, resume=True) + ["--config.train.steps=4"])


def _processes_below(pid):
  """Live processes under ``pid`` (from /proc parent links)."""
  parents = {}
  for name in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{name}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
      if fields[0] != b"Z":
        parents[int(name)] = int(fields[1])
    except (OSError, IndexError):
      pass
  below, frontier = set(), [pid]
  while frontier:
    parent = frontier.pop()
    children = {p for p, pp in parents.items() if pp == parent} - below
    below |= children
    frontier.extend(children)
  return below


def _reap_orphans():
  while True:
    try:
      if os.waitpid(-1, os.WNOHANG)[0] == 0:
        return
    except ChildProcessError:
      return


@pytest.mark.slow
def test_sigterm_and_ctrl_c_anywhere_save_exit_cleanly_and_resume_identically(reference):
  root, cache, ref_dir, _ = reference
  run_dir = str(root / "preempted")
  libc = ctypes.CDLL("libc.so.6")
  # As a child subreaper this test inherits whatever a launch leaves running (a verifier worker,
  # a child of one): orphans that would otherwise vanish under init are counted here.
  assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
  ends = []
  try:
    for i, (point, step) in enumerate(PREEMPT_CHAIN):
      # Processes this pytest process already had (the verifier pool of an earlier in-process
      # run of the suite) are not the launch's.
      before = _processes_below(os.getpid())
      result = _launch(point, _args(run_dir, resume=i > 0), cache)
      ended = time.time()
      leftovers = _processes_below(os.getpid()) - before
      ends.append((point, result.returncode, result.stderr))
      assert not leftovers, (point, leftovers)
      assert "Traceback" not in result.stderr and "stale lock" not in result.stderr, (
          point, result.stderr[-3000:])
      assert not os.path.exists(os.path.join(run_dir, run_dir_lib.LOCK_FILE)), point
      if point == "none":
        assert result.returncode == 0, result.stderr[-3000:]
        continue
      signalled = re.search(r"SIGNALLED \S+ ([0-9.]+)", result.stderr)
      assert signalled and ended - float(signalled.group(1)) < GRACE_S, point
      last = result.stderr.strip().splitlines()[-1]
      checkpoints = os.path.join(run_dir, "checkpoints")
      if point.startswith("int:"):
        assert result.returncode == 130, (point, result.stderr[-3000:])
        assert last == (f"interrupted (SIGINT) at step {step}: not saved past the last "
                        f"checkpoint in {checkpoints}; resume with --config.train.resume=True")
        continue
      assert result.returncode == 0, (point, result.stderr[-3000:])
      if step == 0:
        assert last == ("preempted (SIGTERM) at step 0: no step had ended, nothing to save; "
                        "resume with --config.train.resume=True")
      else:
        assert last == (f"preempted (SIGTERM) at step {step}: checkpoint saved in {checkpoints}; "
                        "resume with --config.train.resume=True")
        assert run_dir_lib.committed_steps(run_dir)[-1] == step
  finally:
    libc.prctl(36, 0, 0, 0, 0)
    _reap_orphans()
  _assert_same_records(_records(ref_dir), _records(run_dir))
  assert os.path.isfile(os.path.join(run_dir, "hf", "config.json"))

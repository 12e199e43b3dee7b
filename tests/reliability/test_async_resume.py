"""kill -9 of an asynchronous run whose sampler has filled its queue, then resume: every prompt
is trained on once, in order. The checkpoint records the data position the learner consumed, not
the one the sampler had drawn ahead to (rljax.train.actors)."""
import glob
import json
import os
import subprocess
import sys

import pytest

from rljax.runs import metrics as metrics_lib
from tests.train import tiny

BOUND, STEPS, PROMPTS = 2, 6, 2  # rollout.max_staleness, train.steps, rollout.prompts_per_step
EXTRA = {"rollout.max_staleness": str(BOUND), "train.steps": str(STEPS),
         "train.checkpoint_every": "2", "rollout.prompts_per_step": str(PROMPTS)}


def _launch(point, run_dir, cache, resume=False):
  env = dict(os.environ, PYTHONPATH=tiny.ROOT, JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  extra = dict(EXTRA, **({"train.resume": "true"} if resume else {}))
  cmd = [sys.executable, "-m", "tests.reliability.killable", point]
  return subprocess.run(cmd + tiny.args("grpo", run_dir, extra), cwd=tiny.ROOT, env=env,
                        capture_output=True, text=True, timeout=300, start_new_session=True)


def _checkpointed_position(run_dir, step):
  """The data position checkpoint ``step`` recorded (its JSON item, read without orbax)."""
  for path in glob.glob(os.path.join(run_dir, "checkpoints", str(step), "extra", "*")):
    try:
      with open(path) as f:
        return json.load(f)["data"]["position"]
    except (ValueError, KeyError, IsADirectoryError):
      continue
  raise AssertionError(f"no extra item in checkpoint {step}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """One compilation cache for every launch of this file (the same programs): only the first
  compiles. Not the session's: a kill -9 could cut a write short."""
  return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.mark.slow
def test_kill_with_a_full_queue_then_resume_trains_each_prompt_once(tmp_path, cache):
  run_dir = str(tmp_path / "run")
  killed = _launch("queue:3", run_dir, cache)
  assert killed.returncode == -9 and "KILLED queue:3" in killed.stderr, killed.stderr[-3000:]
  # Killed during step 3 with steps 3 and 4 sampled ahead (prompts up to 10 drawn): the step-2
  # checkpoint holds the 4 prompts the learner consumed.
  assert _checkpointed_position(run_dir, 2) == 2 * PROMPTS
  resumed = _launch("none", run_dir, cache, resume=True)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  rows = [r for r in metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
          if "loss" in r]
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
  # The position after each step's batch: consecutive, so no prompt was lost or repeated.
  assert [r["async/data_position"] for r in rows] == [PROMPTS * s for s in range(1, STEPS + 1)]
  assert all(0 <= r["async/staleness"] <= BOUND for r in rows)
  assert rows[2]["async/staleness"] == 0  # step 3 (the first after the resume): fresh weights


@pytest.mark.slow
def test_sigterm_of_an_asynchronous_run_saves_and_exits_cleanly(tmp_path, cache):
  """SIGTERM during an update while the sampler thread runs ahead: the step ends, its
  checkpoint is saved with the learner's data position, the thread is stopped and the process
  exits 0 with one line; the resumed run goes on from there."""
  run_dir = str(tmp_path / "run")
  stopped = _launch("term:update:3", run_dir, cache)
  assert stopped.returncode == 0, stopped.stderr[-3000:]
  assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
  assert stopped.stderr.strip().splitlines()[-1].startswith("preempted (SIGTERM) at step 3: "
                                                            "checkpoint saved")
  assert _checkpointed_position(run_dir, 3) == 3 * PROMPTS
  resumed = _launch("none", run_dir, cache, resume=True)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  rows = [r for r in metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
          if "loss" in r]
  assert [r["async/data_position"] for r in rows] == [PROMPTS * s for s in range(1, STEPS + 1)]

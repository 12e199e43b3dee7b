"""A sweep stopped by SIGTERM, or killed with kill -9, leaves no process behind (its ``rljax
train`` run, the run's verifier workers) and no lock that would refuse the rerun."""
import os
import signal
import subprocess
import sys
import time

import pytest

from rljax.rewards import isolation
from rljax.sweep import runner, study as study_lib
from rljax.runs import run_dir as run_dir_lib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STUDY = os.path.join(HERE, "stop_study.py")


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie has ended
  except OSError:
    return False


def _descendants(roots: set[int]) -> set[int]:
  table = isolation.process_table()
  seen = set()
  for root in roots:
    if root in table:
      seen |= {pid for pid in isolation.process_tree(root, table) if pid != root}
  return seen


@pytest.fixture
def start_sweep():
  """Starts ``rljax sweep`` of the stop study under a root; whatever a failed test left running
  (the sweep, its run, the run's workers) is killed at teardown, so no later test sees it."""
  started = []

  def start(root):
    env = dict(os.environ, PYTHONPATH=ROOT)  # the session's compilation cache is inherited
    sweep = subprocess.Popen([sys.executable, "-m", "rljax", "sweep", STUDY, "--root", str(root)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    started.append(sweep)
    return sweep

  yield start
  for sweep in started:
    for pid in _descendants({sweep.pid}) | {sweep.pid}:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    sweep.communicate()


def _wait_for_workers(sweep, workers=2, timeout_s=600):
  """The pids under the sweep once its run has started its ``workers`` verifier workers
  (processes under the train process; they start one after another)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    assert sweep.poll() is None, sweep.communicate()
    tree = _descendants({sweep.pid})
    table = isolation.process_table()
    if sum(table.get(pid, (None,))[0] in tree for pid in tree) >= workers:  # grandchildren
      return tree
    time.sleep(0.2)
  raise AssertionError(f"the run never started its {workers} verifier workers")


def _wait_all_gone(pids, timeout_s=180):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    pids = pids | _descendants(pids)  # anything they started meanwhile
    if not any(_alive(p) for p in pids):
      return
    time.sleep(0.2)
  raise AssertionError(f"processes left behind: {sorted(p for p in pids if _alive(p))}")


def _run_dir(root):
  study = study_lib.load_study(STUDY)
  return runner.plan_runs(study, str(root))[0].run_dir


def _lock_is_free(run_dir):
  lock = run_dir_lib.RunLock(run_dir)  # raises RunDirError if a run still holds it
  lock.release()
  return True


@pytest.mark.slow
def test_sigterm_stops_the_sweep_and_its_run_with_no_process_left(tmp_path, start_sweep):
  sweep = start_sweep(tmp_path)
  tree = _wait_for_workers(sweep)
  assert len(tree) >= 3  # the train process and its 2 verifier workers
  sweep.send_signal(signal.SIGTERM)
  out, err = sweep.communicate(timeout=300)
  assert sweep.returncode == 128 + signal.SIGTERM, err[-2000:]
  assert err.strip().splitlines() == [err.strip()]  # one line
  assert err.startswith("sweep stopped by SIGTERM: forwarded to its runs") and "resume" in err
  _wait_all_gone(tree)
  run_dir = _run_dir(tmp_path)
  assert _lock_is_free(run_dir)
  with open(os.path.join(run_dir, runner.LOG_FILE)) as f:
    log = f.read()
  assert "SIGTERM" in log  # the run itself was stopped by the forwarded signal, not killed
  # The rerun resumes the run (its config.json is there) instead of refusing or starting anew.
  again = subprocess.run([sys.executable, "-m", "rljax", "sweep", STUDY, "--root", str(tmp_path),
                          "--print-commands"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout.strip().endswith("--config.train.resume=True")


@pytest.mark.slow
def test_kill_9_of_the_sweep_ends_its_run_and_workers(tmp_path, start_sweep):
  sweep = start_sweep(tmp_path)
  tree = _wait_for_workers(sweep)
  sweep.kill()
  sweep.communicate(timeout=60)
  assert sweep.returncode == -signal.SIGKILL
  _wait_all_gone(tree)  # the run got the parent-death signal; its workers died with it
  assert _lock_is_free(_run_dir(tmp_path))

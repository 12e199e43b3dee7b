"""A full disk is one line and exit status 2, at start (no run.lock left behind) and mid-run
(orbax's background tracebacks filtered). The disk is "full" through RLIMIT_FSIZE in a child
process: a write past the limit fails with EFBIG, as one past the free space fails with ENOSPC."""
import os
import subprocess
import sys

from tests import xla_cache
from tests.train import tiny

CHILD = """
import resource, signal, sys
from rljax import cli
from rljax.train import loop  # imported before the limit: importing may write caches
from tests.train import tiny
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death past the limit
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
cli.entry(tiny.args("grpo", sys.argv[2], {"train.steps": "3", "train.checkpoint_every": "1"}))
"""

LINE = ("(the disk is full, or a quota or file-size limit was reached). Free space and continue "
        "with --config.train.resume=True")


def _train_with_file_limit(limit: int, run_dir: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", CHILD, str(limit), run_dir], cwd=tiny.ROOT,
                        capture_output=True, text=True, timeout=300,
                        # A cache entry past the limit is cut short: in the run's own cache.
                        env=dict(xla_cache.env_without(), PYTHONPATH=tiny.ROOT,
                                 JAX_PLATFORMS="cpu"))


def test_disk_full_at_start_leaves_no_lock(tmp_path):
  run = str(tmp_path / "run")
  done = _train_with_file_limit(0, run)  # not even the lock's record fits
  assert done.returncode == 2, done.stderr
  lines = [l for l in done.stderr.splitlines() if not l.startswith("WARNING")]
  assert lines == [f"error: writing {run}/run.lock failed: File too large {LINE} (checkpoints "
                   "that were not complete are never resumed from), or choose a train.run_dir "
                   "on another disk"], done.stderr
  assert not os.path.exists(os.path.join(run, "run.lock"))


def test_disk_full_mid_run_is_one_line(tmp_path):
  run = str(tmp_path / "run")
  done = _train_with_file_limit(60_000, run)  # config and metrics fit, a checkpoint does not
  assert done.returncode == 2, done.stderr[-3000:]
  errors = [l for l in done.stderr.splitlines() if l and not l.startswith("WARNING")]
  assert errors == [f"error: a write of the run failed: File too large {LINE} (checkpoints that "
                    "were not complete are never resumed from), or choose a train.run_dir on "
                    "another disk"], done.stderr[-3000:]
  assert "Traceback" not in done.stderr
  assert not os.path.exists(os.path.join(run, "run.lock"))
  assert os.path.exists(os.path.join(run, "config.json"))  # what was written stays


def test_only_a_write_without_room_is_called_a_full_disk():
  import errno
  from rljax import errors
  wrapped = ValueError("OUT_OF_RANGE: Error writing \"params/0\": Failed to write 10 bytes to "
                       "file 32: No space left on device [os_error_code='28']")
  assert "No space left on device (the disk is full" in str(errors.disk_full(wrapped))
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/r/metrics.jsonl")
    except OSError as cause:
      raise RuntimeError("writer failed") from cause
  except RuntimeError as chained:
    assert str(errors.disk_full(chained)).startswith("writing /r/metrics.jsonl failed: No space")
  # Device memory is no disk: XLA's out-of-memory error stays an internal error with traceback.
  assert errors.disk_full(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8 GiB")) \
      is None
  assert errors.disk_full(OSError(errno.EACCES, "Permission denied")) is None

"""A run directory belongs to one live run: a lock, and the checks that decide fresh vs resume.

``claim(config)`` is called when ``train`` starts, before any model is built:

* **Lock.** ``<run_dir>/run.lock`` is held with ``flock`` for the life of the run and records
  ``{pid, host, started}``. The kernel releases it when the process dies (kill -9 included), so a
  lock file left by a dead run is stale: it is reported (who held it, since when) and taken over.
  A second run into the same directory refuses with one line naming the holder.
* **Fresh or resume.** ``train.resume=True`` needs a run there (its ``config.json`` or a committed
  checkpoint): a misspelt path is an error, not a silent fresh start. A fresh run refuses a
  directory holding committed checkpoints. A resumed run must have the same config as the run
  that wrote the directory, except the keys whose declared effect is not ``result``
  (``rljax.config.effects.resumable``: where and how often to write, evaluate and show things,
  how to lay the same computation out) and those the user names in ``train.resume_override``;
  ``train.steps`` may grow but not fall below the latest checkpoint.
* **Same data.** ``data.json`` records the sha256 of the files a file ``data.source`` reads, and
  of the other files the command names (``rljax rm``'s pairs); a resume whose files differ is
  refused unless the key is named in ``train.resume_override`` (the data order and the eval set
  would change silently).
* ``config.json`` is written (atomically) once these checks pass, so a run killed even before its
  first checkpoint can be resumed.

Only the main process of a multi-process run claims the directory. URLs (``gs://``, any
``scheme://``) are refused with one line until runs go through one path abstraction (no ``flock``
there: the lock must become a lease file). A path that cannot be created or written (a symlink
loop, no permission, a full disk) is one line naming it, and no ``run.lock`` is left behind.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
import time

from rljax import errors
from rljax.config import effects
from rljax.errors import RljaxError, RunDirError, StartupError
from rljax.data import sources
from rljax.parallel import distributed

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.json"
DATA_FILE = "data.json"
ENV_FAILURES_FILE = "env_failures.jsonl"  # failed environment calls (rljax.envs.failures)

class RunLock:
  """An exclusive ``flock`` on ``<run_dir>/run.lock``; ``release()`` (or process death) frees it."""

  def __init__(self, run_dir: str):
    self.path = os.path.join(run_dir, LOCK_FILE)
    self.stale: dict | None = None  # the record of a dead holder this lock took over
    os.makedirs(run_dir, exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        holder = _read_record(self.path)
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
          raise
        raise RunDirError(f"{run_dir} is in use by {_describe(holder)}; wait for it to finish, "
                          "stop it, or choose another train.run_dir") from None
      # The holder may have released and unlinked the file between our open and flock.
      if os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(fd).st_ino:
        break
      os.close(fd)
    self.fd = fd
    previous = _read_record(self.path)
    if previous:
      self.stale = previous
      logger.warning("%s: stale lock of %s (that process is gone); taken over", self.path,
                     _describe(previous))
    try:
      self._write_record()
    except OSError as e:
      self.release()  # an empty run.lock left behind would read as "being written" forever
      raise OSError(e.errno, e.strerror, self.path) from None

  def _write_record(self) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    os.ftruncate(self.fd, 0)
    os.pwrite(self.fd, json.dumps(record).encode(), 0)
    os.fsync(self.fd)

  def release(self) -> None:
    if self.fd is None:
      return
    with contextlib.suppress(FileNotFoundError):
      os.unlink(self.path)  # before unlocking: nobody can lock a file we then delete
    os.close(self.fd)
    self.fd = None


def _read_record(path: str) -> dict:
  try:
    with open(path) as f:
      text = f.read()
    return json.loads(text) if text.strip() else {}
  except (OSError, ValueError):
    return {}


def _describe(record: dict) -> str:
  if not record:
    return "another process (lock file being written)"
  started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started", 0)))
  return f"pid {record.get('pid')} on host {record.get('host')} since {started}"


# --- what a directory holds -----------------------------------------------------------------------

def committed_steps(run_dir: str) -> list[int]:
  """Steps under ``<run_dir>/checkpoints`` that hold orbax's commit marker (no orbax needed)."""
  root = os.path.join(run_dir, "checkpoints")
  if not os.path.isdir(root):
    return []
  return sorted(int(name) for name in os.listdir(root) if re.fullmatch(r"\d+", name)
                and os.path.isfile(os.path.join(root, name, "commit_success.txt")))


def holds_run(run_dir: str) -> bool:
  """Whether ``run_dir`` holds an rljax run: a committed checkpoint, or the ``config.json`` of
  an rljax config (its ``train`` section). A Hugging Face directory's ``config.json`` (an export,
  a model) is not one."""
  saved = read_config(run_dir)
  return bool(committed_steps(run_dir)) or (isinstance(saved, dict) and
                                            isinstance(saved.get("train"), dict))


def flatten_config(tree, prefix: str = "") -> dict:
  """``{"a.b": leaf}`` of a nested config dict (lists as tuples)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten_config(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
  return out


def config_differences(saved: dict, current: dict, allowed=()) -> list[str]:
  """``'key: saved -> current'`` for every key that differs, except the resumable ones (their
  declared effect: ``rljax.config.effects.resumable``), the ``allowed`` keys and their sub-keys."""
  skip = tuple(allowed)
  a, b = flatten_config(saved), flatten_config(current)
  diffs = []
  for key in sorted(set(a) | set(b)):
    if effects.resumable(key) or any(key == s or key.startswith(s + ".") for s in skip):
      continue
    if a.get(key, "<absent>") != b.get(key, "<absent>"):
      diffs.append(f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
  return diffs


def read_config(run_dir: str) -> dict | None:
  """The ``config.json`` of the run in ``run_dir`` as a dict (None: there is none, or it does not
  read)."""
  try:
    with open(os.path.join(run_dir, CONFIG_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_start(config, current: dict, steps_key: str = "train.steps") -> None:
  """Raise ``RunDirError`` unless ``config`` may start (fresh) or resume in its run dir;
  ``steps_key``: the key of the run's step count (``rm.steps`` for ``rljax rm``)."""
  t = config.train
  run_dir = t.run_dir
  steps = committed_steps(run_dir)
  if t.resume:
    if not holds_run(run_dir):
      raise RunDirError(f"train.resume=True but {run_dir} holds no run (no {CONFIG_FILE}, no "
                        "committed checkpoint): check the path, or leave train.resume unset to "
                        "start a new run there")
    saved_path = os.path.join(run_dir, CONFIG_FILE)
    if os.path.isfile(saved_path):
      with open(saved_path) as f:
        saved = json.load(f)
      overrides = tuple(t.resume_override)
      diffs = config_differences(saved, current, overrides)
      if diffs:
        raise RunDirError(
            f"cannot resume {run_dir}: its config differs in {'; '.join(diffs)}. Resume with the "
            "same values, or name the keys in train.resume_override, e.g. "
            f"--config.train.resume_override=\"{tuple(d.split(':')[0] for d in diffs)}\"")
    total = _config_value(config, steps_key)
    if steps and total < steps[-1]:
      raise RunDirError(f"{steps_key}={total} is below the latest checkpoint {steps[-1]} of "
                        f"{run_dir}: a resumed run can only grow {steps_key}")
  elif steps:
    raise RunDirError(f"{run_dir} already holds checkpoints {steps}: pass "
                      "--config.train.resume=True to continue it, or choose another "
                      "train.run_dir")


def records_pairs(run_dir: str) -> str | None:
  """The pairs file an ``rljax rm`` run's data record fingerprints (None: not such a run)."""
  files = _read_record(os.path.join(run_dir, DATA_FILE)).get("files") or {}
  return files["rm.train_file"].get("path") if "rm.train_file" in files else None


def write_config(run_dir: str, config_json: str) -> None:
  _write_atomic(os.path.join(run_dir, CONFIG_FILE), config_json)


def data_record(config, files: tuple[str, ...] = ()) -> dict:
  """What ``data.json`` records: ``data.source`` and the sha256 of the files it reads, and of the
  file each config key of ``files`` names (``rljax rm``'s pairs: ``rm.train_file``...)."""
  record = {"source": config.data.source, "sha256": sources.fingerprint(config.data.source)}
  named = {key: _config_value(config, key) for key in files}
  record["files"] = {key: {"path": path, "sha256": file_sha256(path)}
                     for key, path in named.items() if path}
  return record


def _config_value(config, key: str):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def check_data(config, record: dict) -> None:
  """Refuse to resume on data files other than those the run started with (module docstring):
  ``data.source``'s and each recorded file key's, unless ``train.resume_override`` names it."""
  t = config.train
  path = os.path.join(t.run_dir, DATA_FILE)
  if not t.resume or not os.path.isfile(path):
    return
  saved = _read_record(path)
  overrides = tuple(t.resume_override)
  if "data.source" not in overrides and saved.get("sha256") != record["sha256"]:
    raise RunDirError(
        f"cannot resume {t.run_dir}: its data changed (data.source={saved.get('source')!r}, "
        f"sha256 {str(saved.get('sha256'))[:12]}...; now {config.data.source!r}, sha256 "
        f"{str(record['sha256'])[:12]}...). Resume with the original files, or continue on these "
        "with --config.train.resume_override=\"('data.source',)\"")
  for key, was in (saved.get("files") or {}).items():
    now = record["files"].get(key)
    if key in overrides or now is None or now["sha256"] == was.get("sha256"):
      continue
    raise RunDirError(
        f"cannot resume {t.run_dir}: the file of {key} changed ({was.get('path')!r}, sha256 "
        f"{str(was.get('sha256'))[:12]}...; now {now['path']!r}, sha256 {now['sha256'][:12]}...)."
        f" Resume with the original file, or continue on this one with "
        f"--config.train.resume_override=\"('{key}',)\"")


def _write_atomic(path: str, text: str) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except OSError:
    with contextlib.suppress(OSError):
      os.unlink(tmp)  # a partial file the next run would have to explain
    raise


def check_path(run_dir: str) -> None:
  """Refuse a run dir this version cannot hold: a URL (object storage), or a path that exists
  as something other than a directory or cannot be looked up (a symlink loop)."""
  if "://" in run_dir:
    raise RunDirError(
        f"train.run_dir={run_dir!r}: run directories on object storage ({run_dir.split('://')[0]}"
        "://) are not supported yet; use a local or mounted path (e.g. gcsfuse) instead")
  try:
    os.stat(run_dir)
  except FileNotFoundError:
    return
  except OSError as e:
    raise _path_error(run_dir, e) from None
  if not os.path.isdir(run_dir):
    raise RunDirError(f"train.run_dir={run_dir!r} exists and is not a directory; choose another "
                      "train.run_dir")


def check_creatable(path: str, key: str, *, file: bool = False, value: str | None = None) -> None:
  """Refuse, before anything is trained, a ``path`` (named by config key ``key``, whose value is
  ``value``, default ``path``: a directory, or a ``file``) that a run would write and could not:
  it exists as the other kind, or its nearest existing ancestor is not a directory in which this
  process can make one. Tried by making and removing a directory there (``os.access`` answers
  yes for root where ``mkdir`` fails: /proc, a read-only mount); writes go beside ``path`` first
  (``<path>.tmp-*``, then renamed)."""
  named = f"{key}={path if value is None else value!r}"
  if os.path.exists(path):
    if os.path.isdir(path) == file:
      raise StartupError(f"{named} exists and is not a {'file' if file else 'directory'}; "
                         f"choose another {key}")
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise StartupError(f"{named} cannot be created: {parent!r} is not a directory; choose "
                       f"another {key}")
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".rljax-write-check-", dir=parent))
  except OSError as e:
    full = errors.disk_full(e)
    if full is not None:
      raise full from None
    raise StartupError(f"{named} cannot be created: {parent!r} cannot be written "
                       f"({e.strerror}); choose another {key}") from None


def _path_error(run_dir: str, error: OSError) -> RljaxError:
  full = errors.disk_full(error)
  if full is not None:
    return full
  where = f" ({error.filename})" if error.filename and error.filename != run_dir else ""
  return RunDirError(f"cannot use train.run_dir={run_dir!r}: {error.strerror}{where}; fix the "
                     "path or its permissions, or choose another train.run_dir")


_HELD: dict[str, RunLock] = {}


@contextlib.contextmanager
def claimed(config, files: tuple[str, ...] = (), steps_key: str = "train.steps"):
  """Hold ``train.run_dir`` for a run (module docstring): lock, fresh/resume checks,
  ``config.json``; ``files``: config keys naming files the run reads besides ``data.source``'s,
  fingerprinted in ``data.json`` like them; ``steps_key``: the key of its step count. Released
  when the block exits, however it exits."""
  distributed.initialize(config.dist)
  run_dir = config.train.run_dir
  check_path(run_dir)
  if not distributed.is_main_process():
    yield None
    return
  if config.train.resume and not holds_run(run_dir):  # before the lock creates the directory
    check_start(config, {})
  key = os.path.realpath(run_dir)
  if key in _HELD:  # the same process already runs there (a train() inside a train())
    raise RunDirError(f"{run_dir} is in use by this process (a run is already training there)")
  try:
    lock = RunLock(run_dir)
  except OSError as e:
    raise _path_error(run_dir, e) from None
  _HELD[key] = lock
  try:
    current = json.loads(config.to_json_best_effort())
    check_start(config, current, steps_key)
    record = data_record(config, files)
    check_data(config, record)
    try:
      _write_atomic(os.path.join(run_dir, DATA_FILE), json.dumps(record))
      write_config(run_dir, config.to_json_best_effort(indent=2))
    except OSError as e:
      raise _path_error(run_dir, e) from None
    yield lock
  finally:
    _HELD.pop(key, None)
    lock.release()


def check_convert_target(run_dir: str, out: str, force: bool = False) -> None:
  """``rljax convert RUN OUT``: OUT must not be a run directory nor lie inside RUN, and must be
  empty or new unless ``force`` (convert never overwrites files it did not write)."""
  run, target = os.path.realpath(run_dir), os.path.realpath(out)
  if target == run or target.startswith(run + os.sep) or holds_run(out):
    raise RunDirError(f"convert: the output {out!r} is (inside) a run directory; write the "
                      f"Hugging Face export outside {run_dir!r} and outside any run")
  if os.path.exists(out) and not os.path.isdir(out):
    raise RunDirError(f"convert: the output {out!r} is a file; name a new or empty directory")
  if not force and os.path.isdir(out) and os.listdir(out):
    raise RunDirError(f"convert: the output {out!r} is not empty (it holds "
                      f"{sorted(os.listdir(out))[:3]}...); name a new or empty directory, or pass "
                      "--force to overwrite what is there")

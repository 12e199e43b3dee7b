"""A sandbox for untrusted Python: generated code run by a ``python`` tool or checked against a
task's unit tests (``rljax.agents.code``), in a process that cannot reach the network, use more
than its limits, write outside its own directory, or outlive its run.

``run_python(code, limits) -> Run`` starts a fresh interpreter through the launcher
(``rljax/agents/sandbox_launch.py``, which confines itself and then becomes the program) and
returns its exit status and output. Two isolation modes (``isolation_mode()``):

- ``'namespaces'`` (root, and a kernel that allows ``unshare``: checked once per process by
  running a program): a network namespace with no interface up, a mount namespace whose
  world-writable directories are private ``tmpfs`` mounts of ``disk_mb`` (the program's working
  directory among them), and a user id of its own (``UID_BASE`` + the launcher's pid, unique
  while it runs): ``RLIMIT_NPROC`` then counts this program's processes alone, and every process
  it started, in whatever session or group, is ended by one ``kill(-1)`` as that user;
- ``'policy'`` (anything else): sockets refused by an audit hook in the program's interpreter, a
  private temporary directory removed afterwards, processes ended by their process group (a
  program that starts a new session escapes that; the namespaces mode is the one to rely on).

Both apply ``Limits``: CPU seconds (``RLIMIT_CPU``: SIGXCPU, then SIGKILL a second later), wall
seconds (the parent kills everything), address space (``RLIMIT_AS``: an allocation past it is a
``MemoryError``), processes (``RLIMIT_NPROC``: a fork past it fails with ``EAGAIN``), the size of
one written file (``RLIMIT_FSIZE``: SIGXFSZ / ``EFBIG``), open files, and the bytes of output the
parent reads (past them it kills the program: a program printing 1 GB costs 64 KiB of memory
and is stopped at once). A run that breaks a limit is a ``Run`` whose ``status`` says which and
whose ``detail`` explains it in one line; nothing raises, and nothing the program started is left
running when ``run_python`` returns.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launch.py")
UID_BASE = 1_000_000  # sandbox users: UID_BASE + the launcher's pid
MODES = ("namespaces", "policy")
READ_CHUNK = 1 << 16
REAP_S = 5.0  # longest wait for the program's processes to die once killed


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one sandboxed program may use (module docstring)."""
  cpu_s: int = 10
  wall_s: float = 20.0
  memory_mb: int = 1024
  processes: int = 16
  file_mb: int = 16
  disk_mb: int = 64  # each private tmpfs (namespaces mode)
  output_bytes: int = 1 << 16  # stdout and stderr together
  open_files: int = 64

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"sandbox limit {field.name}={value!r} must be a positive number")


@dataclasses.dataclass(frozen=True)
class Run:
  """One sandboxed program's end.

  status: 'ok' (exit 0), 'exit' (another exit code), 'cpu' (over ``cpu_s``), 'file' (a file over
    ``file_mb``), 'signal' (killed by another signal), 'timeout' (over ``wall_s``), 'output'
    (over ``output_bytes``), 'refused' (the sandbox could not be set up: ``detail`` says why).
  """
  status: str
  exit_code: Optional[int]
  stdout: str
  stderr: str
  wall_s: float
  isolation: str
  detail: str = ""

  @property
  def ok(self) -> bool:
    return self.status == "ok"


def _user_processes(uid: int) -> list[tuple[int, int, bool]]:
  """``(pid, parent pid, zombie)`` of every process whose real user is ``uid`` (``/proc``)."""
  found = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status") as f:
        head = f.read(1024).splitlines()
      fields = dict(line.split(":\t", 1) for line in head if ":\t" in line)
      if int(fields["Uid"].split()[0]) == uid:
        found.append((int(name), int(fields["PPid"]), fields["State"].startswith("Z")))
    except (OSError, KeyError, ValueError, IndexError):  # gone meanwhile
      continue
  return found


def _kill_user(uid: int) -> None:
  """SIGKILL to every process of ``uid``: ``kill -9 -1`` run as that user."""
  kill = shutil.which("kill")
  argv = [kill, "-9", "-1"] if kill else [sys.executable, "-I", "-S", "-c",
                                            "import os; os.kill(-1, 9)"]
  subprocess.run(argv, user=uid, group=uid, extra_groups=[], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, check=False)


def _end_all(proc: subprocess.Popen, uid: Optional[int]) -> None:
  """Kill the program and everything it started, and reap those that are our children (a
  parent that is a child subreaper, like the verifier workers, inherits the orphans)."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher leads its session: it cannot leave it
  except (ProcessLookupError, PermissionError):
    pass
  try:
    proc.wait(timeout=REAP_S)
  except subprocess.TimeoutExpired:
    pass
  if uid is None:
    return
  deadline = time.monotonic() + REAP_S
  while True:
    left = _user_processes(uid)
    for pid, parent, _ in left:  # our children (we are a subreaper) are ours to reap
      if parent == os.getpid():
        try:
          os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
          pass
    if all(zombie for _, _, zombie in left) or time.monotonic() > deadline:
      return  # a zombie of another parent is dead: its parent reaps it
    _kill_user(uid)
    time.sleep(0.002)


def _read_report(fd: int, deadline: float) -> dict:
  """The launcher's report (until it closes the pipe by ``execve`` or exits)."""
  data = b""
  with selectors.DefaultSelector() as sel:
    sel.register(fd, selectors.EVENT_READ)
    while time.monotonic() < deadline:
      if sel.select(timeout=max(deadline - time.monotonic(), 0.0)):
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
          break
        data += chunk
  try:
    return json.loads(data.decode() or "null") or {"ok": False, "why": "the launcher said nothing"}
  except ValueError:
    return {"ok": False, "why": "the launcher's report is unreadable"}


def _collect(proc: subprocess.Popen, limits: Limits, deadline: float) -> tuple[bytes, bytes, str]:
  """stdout, stderr and why reading stopped: '' (the program ended), 'timeout' or 'output'."""
  out = {proc.stdout: bytearray(), proc.stderr: bytearray()}
  total = 0
  with selectors.DefaultSelector() as sel:
    for stream in out:
      os.set_blocking(stream.fileno(), False)
      sel.register(stream, selectors.EVENT_READ)
    while sel.get_map():
      now = time.monotonic()
      if now >= deadline:
        return bytes(out[proc.stdout]), bytes(out[proc.stderr]), "timeout"
      for key, _ in sel.select(timeout=min(0.05, deadline - now)):
        chunk = os.read(key.fileobj.fileno(), READ_CHUNK)
        if not chunk:
          sel.unregister(key.fileobj)
          continue
        keep = max(limits.output_bytes - total, 0)
        out[key.fileobj] += chunk[:keep]
        total += len(chunk)
        if total > limits.output_bytes:
          return bytes(out[proc.stdout]), bytes(out[proc.stderr]), "output"
      if proc.poll() is not None:  # ended; what it started must not keep the pipes open
        break
  return bytes(out[proc.stdout]), bytes(out[proc.stderr]), ""


def _verdict(code: Optional[int], stderr: str, limits: Limits) -> tuple[str, str]:
  if code == 0:
    return "ok", ""
  if code is None:
    return "signal", "the program did not exit"
  if code < 0:
    sig = -code
    if sig in (signal.SIGXCPU, signal.SIGKILL):
      return "cpu", f"CPU time over {limits.cpu_s} s (RLIMIT_CPU)"
    if sig == signal.SIGXFSZ:
      return "file", f"a file over {limits.file_mb} MB (RLIMIT_FSIZE)"
    return "signal", f"killed by {signal.Signals(sig).name}"
  last = (stderr.strip().splitlines() or [""])[-1][:300]
  return "exit", f"exit {code}" + (f": {last}" if last else "")


def run_python(code: str, limits: Limits = Limits(), *, mode: Optional[str] = None) -> Run:
  """Run ``code`` as the ``__main__`` program of a sandboxed interpreter (module docstring).
  ``mode``: 'namespaces' or 'policy'; None: the strongest this process may use."""
  mode = mode or isolation_mode()
  if mode not in MODES:
    raise ValueError(f"sandbox mode {mode!r}; allowed: {MODES}")
  t0 = time.monotonic()
  workdir = tempfile.mkdtemp(prefix="rljax-sandbox-") if mode == "policy" else None
  report_r, report_w = os.pipe()
  proc = None
  try:
    proc = subprocess.Popen([sys.executable, "-I", "-S", LAUNCHER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(report_w,), start_new_session=True)
    passed_fd = report_w  # pass_fds keeps the descriptor's number in the launcher
    os.close(report_w)
    report_w = None
    uid = UID_BASE + proc.pid if mode == "namespaces" else None
    spec = {"code": code, "mode": mode, "limits": dataclasses.asdict(limits),
            "report_fd": passed_fd, "uid": uid if uid is not None else os.getuid(),
            "parent": os.getpid(), "workdir": workdir,
            "user_processes": len(_user_processes(os.getuid())) if mode == "policy" else 0}
    try:
      proc.stdin.write(json.dumps(spec).encode())
      proc.stdin.close()
    except BrokenPipeError:
      pass
    deadline = t0 + limits.wall_s
    report = _read_report(report_r, deadline)
    if not report.get("ok"):
      _end_all(proc, uid)
      return Run("refused", proc.returncode, "", "", time.monotonic() - t0, mode,
                 f"the sandbox could not be set up: {report.get('why', 'timed out')}")
    stdout, stderr, stopped = _collect(proc, limits, deadline)
    _end_all(proc, uid)
    text = lambda b: b.decode("utf-8", errors="replace")
    wall = time.monotonic() - t0
    if stopped == "timeout":
      status, detail = "timeout", f"wall clock over {limits.wall_s} s (killed)"
    elif stopped == "output":
      status, detail = "output", f"output over {limits.output_bytes} bytes (killed)"
    else:
      status, detail = _verdict(proc.returncode, text(stderr), limits)
    return Run(status, proc.returncode, text(stdout), text(stderr), wall, mode, detail)
  finally:
    for fd in (report_r, report_w):
      if fd is not None:
        os.close(fd)
    if proc is not None:
      for stream in (proc.stdout, proc.stderr):
        stream.close()
    if workdir is not None:
      shutil.rmtree(workdir, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def isolation_mode() -> str:
  """'namespaces' where this process may confine a program so (root, ``unshare`` allowed: one
  probe run), else 'policy'."""
  if not sys.platform.startswith("linux") or os.geteuid() != 0:
    return "policy"
  probe = run_python("print('ok')", Limits(wall_s=30.0), mode="namespaces")
  return "namespaces" if probe.ok and probe.stdout.strip() == "ok" else "policy"

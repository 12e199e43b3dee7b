"""The sandbox's launcher: run as ``python -I -S sandbox_launch.py`` by ``rljax.agents.sandbox``,
it confines itself, then replaces itself (``execve``) with the untrusted program.

Standard library only, and no import of rljax: it starts as a fresh interpreter with no threads,
so that what it does between start and ``execve`` (namespaces, mounts, limits, a change of user)
never runs in a forked copy of the trainer. Its input is one JSON object on stdin (``spec``
below); what it reports before the program starts is one JSON object on the file descriptor
``spec['report_fd']`` (``{"ok": true, ...}`` or ``{"ok": false, "why": ...}``), which closes on
``execve``.

With ``mode='namespaces'`` (root, where the kernel allows ``unshare``):

1. a network namespace of its own (no interface is up: every connection fails, the trainer's
   own endpoint on the loopback included) and a mount namespace of its own;
2. private ``tmpfs`` mounts of ``disk_mb`` over the world-writable directories (``/tmp``,
   ``/var/tmp``, ``/dev/shm``, ``/run/lock``): what the program writes there vanishes with it;
3. its working directory ``/tmp/work`` on that tmpfs, the program written there;
4. the resource limits (``RLIMIT_CPU``, ``_AS``, ``_FSIZE``, ``_NPROC``, ``_NOFILE``, ``_CORE``);
5. the user and group ``uid`` (no supplementary groups): a user of its own, so ``RLIMIT_NPROC``
   counts this program's processes alone, nothing outside the tmpfs is writable that is not
   world-writable, and the parent ends every process it started with one ``kill(-1)`` as that
   user.

With ``mode='policy'`` (no root or no namespaces): the limits, a working directory the parent
made, and an audit hook (``sys.addaudithook``) in the program's interpreter that refuses every
socket; its processes are ended by their process group.
"""
import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    0x1, 0x2, 0x4, 0x20, 0x1000, 0x4000, 0x40000)
PR_SET_PDEATHSIG, SIGKILL = 1, 9
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
WORK = "/tmp/work"

# Runs first in the program's interpreter in policy mode: sockets are refused by an audit hook
# (which code cannot remove), then the program runs as ``__main__``.
POLICY_BOOT = """
import sys
def _refuse(event, args):
  if event in ("socket.__new__", "socket.connect", "socket.bind", "socket.sendto"):
    raise PermissionError("network access refused by the sandbox's policy")
sys.addaudithook(_refuse)
del _refuse
import runpy
runpy.run_path("main.py", run_name="__main__")
"""


def _errno_text(what: str) -> str:
  err = ctypes.get_errno()
  return f"{what} failed: {os.strerror(err)} (errno {err})"


def _mount(libc, source, target, fstype, flags, data) -> None:
  enc = lambda s: None if s is None else s.encode()
  if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
    raise OSError(_errno_text(f"mount {target}"))


def _confine(libc, spec) -> str:
  """Namespaces and private tmpfs mounts; returns the working directory."""
  if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
    raise OSError(_errno_text("unshare(CLONE_NEWNS | CLONE_NEWNET)"))
  _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, None)
  size = f"size={int(spec['limits']['disk_mb'])}m,mode=1777"
  for path in PRIVATE_DIRS:
    if os.path.isdir(path) and not os.path.islink(path):
      _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, size)
  _reach(libc, [sys.base_prefix, sys.prefix])
  os.mkdir(WORK, 0o700)
  return WORK


def _blocked(path: str):
  """The outermost directory above ``path`` that other users cannot search, or None."""
  parts = os.path.realpath(path).split(os.sep)
  for i in range(2, len(parts)):
    above = os.sep.join(parts[:i])
    if not os.stat(above).st_mode & 0o001:
      return above
  return None


def _reach(libc, paths) -> None:
  """Make the interpreter's directories reachable by the sandbox's user, read-only: a directory
  above them that others cannot search (``/root`` of a per-user install) is covered by an empty
  tmpfs holding only them, bound back at their own paths (its other contents stay hidden)."""
  for n, path in enumerate(dict.fromkeys(os.path.realpath(p) for p in paths)):
    above = _blocked(path)
    if above is None:
      continue
    stage = f"/tmp/.reach{n}"
    os.mkdir(stage)
    _mount(libc, path, stage, None, MS_BIND | MS_REC, None)
    if not os.path.ismount(above) or _blocked(path) == above:
      _mount(libc, "tmpfs", above, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.makedirs(path, 0o755, exist_ok=True)
    _mount(libc, stage, path, None, MS_BIND | MS_REC, None)
    _mount(libc, None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)


def _limit(limits: dict) -> None:
  mb = 2**20
  cpu = int(limits["cpu_s"])
  for which, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1),
                            (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
                            (resource.RLIMIT_FSIZE, limits["file_mb"] * mb, limits["file_mb"] * mb),
                            (resource.RLIMIT_NPROC, limits["processes"], limits["processes"]),
                            (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
                            (resource.RLIMIT_CORE, 0, 0)):
    resource.setrlimit(which, (int(soft), int(hard)))


def main() -> None:
  spec = json.loads(sys.stdin.buffer.read())
  report = os.fdopen(spec["report_fd"], "w")
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    namespaces = spec["mode"] == "namespaces"
    work = _confine(libc, spec) if namespaces else spec["workdir"]
    with open(os.path.join(work, "main.py"), "w") as f:
      f.write(spec["code"])
    uid = int(spec["uid"])
    if namespaces:
      for path in (work, os.path.join(work, "main.py")):
        os.chown(path, uid, uid)
    os.chdir(work)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if not namespaces:
      # RLIMIT_NPROC counts the user's processes: the ones it has now, plus the program's.
      spec["limits"]["processes"] += int(spec["user_processes"])
    _limit(spec["limits"])
    if namespaces:
      os.setgroups([])
      os.setgid(uid)
      os.setuid(uid)
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL)  # after setuid, which clears it
    if os.getppid() != int(spec["parent"]):  # the parent died before the signal was armed
      os._exit(1)
  except Exception as e:  # reported; the parent explains the run as refused
    report.write(json.dumps({"ok": False, "why": f"{type(e).__name__}: {e}"[:300]}))
    report.close()
    os._exit(125)
  report.write(json.dumps({"ok": True, "work": work}))
  report.close()
  env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8",
         "TMPDIR": "/tmp" if namespaces else work}
  exe = sys.executable
  argv = [exe, "-I", "-B", "main.py"] if namespaces else [exe, "-I", "-B", "-c", POLICY_BOOT]
  os.execve(exe, argv, env)


if __name__ == "__main__":
  main()

"""Verifier calls in killable worker processes, with a hard per-call timeout.

A verifier is arbitrary Python: sympy simplifying ``9^{9^{9^{9}}}``, a big-integer power, a
user's regex that backtracks forever. A thread cannot be killed and one that holds the GIL stalls
the whole trainer, so ``reward.timeout_s`` is only a real bound when each call runs in a process
the trainer can kill. ``VerifierPool`` keeps ``workers`` such processes; a call that runs past its
deadline has its process killed (SIGKILL) and replaced, and is reported as a timeout.

Start method. On Linux the workers are **forked** from the trainer: they inherit the verifier
function itself (closures, functions defined in a notebook or a test module, registered after
import), so nothing is pickled but the ``(completion, problem)`` arguments and the result. A
forked child runs only the verifier's pure Python: it never touches JAX, whose threads do not
exist in the child. Where fork is unavailable (macOS' default, Windows) the pool uses spawn, and
the verifier must be importable by reference (a module-level function).

Containment. A verifier may do anything its Python can: return a 400-digit integer, fork, exit,
raise ``SystemExit``, signal itself, start a child that never ends, keep memory. Each worker is
the leader of its own session and process group (``os.setsid``: the terminal's Ctrl-C does not
reach it, a timeout kills the whole group), a child subreaper (an orphan of whatever it starts
stays in its tree instead of moving to init), and may add at most ``max_worker_memory_mb`` of
address space to what it inherited (``RLIMIT_AS``). After every call it kills and reaps whatever
processes the call left behind and reports the call as failed; a forked copy of a worker exits
without answering; the answer it sends holds only plain data. A worker is replaced after a timeout,
a death, a ``MemoryError`` or ``worker_max_calls`` calls, and a replaced worker takes its whole
process group and tree with it. So any behaviour of a verifier costs that one answer, never the
run, and leaves no process behind (short of one that deliberately signals the trainer itself).
"""
from __future__ import annotations

import atexit
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from multiprocessing import connection
from typing import Any, Callable, Sequence

try:
  import resource  # imported here: a forked worker must not load extension modules
except ImportError:  # Windows
  resource = None

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Outcome:
  """Result of one call: status 'ok' (value = return), 'error' (value = 'Type: message') or
  'timeout' (value None)."""
  status: str
  value: object = None


def _load_libc():
  """libc, loaded in the trainer (a forked child must not dlopen: the loader lock may be held by
  a thread that does not exist in the child)."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    return ctypes.CDLL("libc.so.6", use_errno=True)
  except OSError:
    return None


_LIBC = _load_libc()


PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
_BLOCKED_WHILE_FORKING = {signal.SIGINT, signal.SIGTERM}


def _isolate(trainer_pid: int, memory_mb: int) -> None:
  """First thing in a new worker (module docstring, Containment)."""
  os.setsid()
  if _LIBC is not None:
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the trainer, kill -9 included
    _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1)
  if os.getppid() != trainer_pid:  # the trainer died before the death signal was armed
    os._exit(0)
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
  # A handler inherited from the trainer (its preemption handler, jax.distributed's) would keep
  # SIGTERM from ending the worker.
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED_WHILE_FORKING)
  if memory_mb:
    _limit_memory(memory_mb)


def _limit_memory(memory_mb: int) -> None:
  """RLIMIT_AS = the address space inherited from the trainer (a JAX process maps many GB it
  never touches) + ``memory_mb``: a bound on what the verifier adds, not on the trainer's size."""
  if resource is None:
    return
  try:
    with open("/proc/self/statm") as f:
      inherited = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
  except OSError:
    return
  limit = inherited + memory_mb * 2**20
  hard = resource.getrlimit(resource.RLIMIT_AS)[1]
  if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
  resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _describe(error: BaseException) -> str:
  try:
    message = str(error)
  except BaseException:  # a user exception whose __str__ fails
    message = "<unprintable>"
  return (f"{type(error).__name__}: {message}" if message else type(error).__name__)[:500]


def _call(fn: Callable[..., Any], args: tuple) -> tuple[str, object, bool]:
  """``(status, value, retire)`` of ``fn(*args)``; nothing it raises, SystemExit and
  KeyboardInterrupt included, escapes."""
  try:
    return "ok", fn(*args), False
  except MemoryError:  # the heap may be left fragmented or full: a fresh worker takes over
    return "error", "MemoryError (over reward.max_worker_memory_mb; worker replaced)", True
  except BaseException as e:
    return "error", _describe(e), False


def _call_here(fn: Callable[..., Any], args: tuple) -> Outcome:
  try:
    return Outcome("ok", fn(*args))
  except Exception as e:
    return Outcome("error", _describe(e))


def _end_leftovers() -> int:
  """Kill and reap every process the last call left behind; returns how many there were. The
  worker is a subreaper, so grandchildren whose parent dies become its children and are found in
  the next round. One ``waitpid`` when the call left nothing."""
  me, left = os.getpid(), set()
  while True:
    try:
      pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return len(left)
    if pid:
      left.add(pid)
      continue
    table = process_table()
    if not table:  # no /proc to find them by (not Linux): they go with the worker's group
      return len(left) + 1
    for child in [pid for pid, (parent, _) in table.items() if parent == me]:
      left.add(child)
      _kill(child)
    try:  # a child missed by the scan (started after it) ends this wait at the call's deadline
      left.add(os.waitpid(-1, 0)[0])
    except ChildProcessError:
      return len(left)


def _worker_main(conn, fn: Callable[..., Any], trainer_pid: int, memory_mb: int) -> None:
  """Worker loop: receive ``(index, args)``, answer ``(index, status, value, retire)``; EOF (or
  ``retire``) ends it."""
  _isolate(trainer_pid, memory_mb)
  me = os.getpid()
  while True:
    try:
      index, args = conn.recv()
    except BaseException:  # EOF: the pool closed
      return
    status, value, retire = _call(fn, args)
    if os.getpid() != me:  # a copy made by os.fork() in the verifier: only the worker answers
      os._exit(0)
    left = _end_leftovers()
    if left and status == "ok":
      status, value = "error", f"the verifier left {left} process(es) running (killed)"
    try:
      conn.send((index, status, value, retire))
    except BaseException as e:  # an unpicklable return value
      try:
        conn.send((index, "error", f"result not transferable: {_describe(e)}"[:500], retire))
      except BaseException:
        os._exit(1)
    if retire:
      return


# --- processes ------------------------------------------------------------------------------------

def process_table() -> dict[int, tuple[int, int]]:
  """``{pid: (parent pid, process group)}`` of every process, from ``/proc`` (empty elsewhere).
  A scan of a few ms: run only when a verifier misbehaved or a worker is replaced."""
  table = {}
  try:
    names = os.listdir("/proc")
  except OSError:
    return table
  for name in names:
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces
      table[int(name)] = (int(fields[1]), int(fields[2]))
    except (OSError, IndexError, ValueError):  # gone meanwhile
      continue
  return table


def process_tree(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
  """``root``, its descendants and the members of its process group."""
  tree = {root} | {pid for pid, (_, group) in table.items() if group == root}
  frontier = [root]
  while frontier:
    parent = frontier.pop()
    for pid, (ppid, _) in table.items():
      if ppid == parent and pid not in tree:
        tree.add(pid)
        frontier.append(pid)
  return tree


def _kill(pid: int) -> None:
  try:
    os.kill(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _start_method() -> str:
  return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class _Worker:
  def __init__(self, ctx, fn, memory_mb: int):
    self.conn, child = ctx.Pipe(duplex=True)
    # Ctrl-C or SIGTERM between the fork and the worker's own handlers would otherwise run the
    # trainer's handlers (a KeyboardInterrupt traceback) in the child; blocked, they wait.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED_WHILE_FORKING)
    try:
      with warnings.catch_warnings():
        # Python 3.12 and JAX warn on fork in a threaded process: the child runs only the
        # verifier's Python (no JAX, no thread-owned lock of the trainer), and a child that did
        # deadlock would be killed at its deadline and replaced like any hung verifier.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        self.process = ctx.Process(target=_worker_main, args=(child, fn, os.getpid(), memory_mb),
                                   daemon=True, name="rljax-verifier")
        self.process.start()
    finally:
      signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    child.close()
    self.task: int | None = None
    self.deadline = 0.0
    self.calls = 0

  def receive(self) -> tuple[Outcome, str]:
    """``(outcome of the call in flight, 'keep' | 'retire' | 'broken')``."""
    try:
      index, status, value, retire = self.conn.recv()
    except (EOFError, OSError):  # the worker died mid-call (os._exit, a signal, the OOM killer)
      return Outcome("error", "verifier process died"), "broken"
    except Exception as e:  # bytes on the pipe that are no answer (the verifier wrote to it)
      return Outcome("error", f"unreadable answer from the verifier process: {_describe(e)}"), \
          "broken"
    if index != self.task or status not in ("ok", "error"):
      return Outcome("error", "the verifier process answered out of turn"), "broken"
    self.calls += 1
    return Outcome(status, value), "retire" if retire else "keep"

  def kill(self) -> None:
    """SIGKILL the worker, its process group and its process tree (what its verifiers started)."""
    pid = self.process.pid
    table = process_table()
    # Walked only while the worker is still our unreaped child: its pid cannot have been reused.
    doomed = process_tree(pid, table) if table.get(pid, (None,))[0] == os.getpid() else set()
    try:
      os.killpg(pid, signal.SIGKILL)  # no such group if it died before its os.setsid()
    except (ProcessLookupError, PermissionError):
      pass
    for member in doomed:
      _kill(member)
    self.process.join(timeout=5)
    self.conn.close()


class VerifierPool:
  """``workers`` processes running ``fn``; ``map`` runs a batch of calls with a per-call timeout.

  Args:
    fn: the function every call runs (``fn(*args)``).
    workers: number of worker processes (>= 1).
    max_worker_memory_mb: address space a worker may add to what it inherited (0: no limit).
    worker_max_calls: calls after which a worker is replaced by a fresh one (0: never).
  """

  def __init__(self, fn: Callable[..., Any], workers: int, max_worker_memory_mb: int = 0,
               worker_max_calls: int = 0):
    if workers < 1:
      raise ValueError(f"reward.workers={workers} must be >= 1")
    self.fn, self.num_workers = fn, workers
    self.memory_mb, self.max_calls = max_worker_memory_mb, worker_max_calls
    self._ctx = multiprocessing.get_context(_start_method())
    self._workers: list[_Worker] = []
    self.replaced = 0  # workers killed after a timeout, a death or a broken answer
    self.recycled = 0  # workers retired after worker_max_calls calls or a MemoryError
    # Asynchronous calls (``submit`` / ``poll``): queued (tag, args, timeout_s), the workers
    # running one, by connection, with the call's tag, and the answers not yet polled. A
    # dispatcher thread receives answers and starts queued calls as workers free up.
    self._queue: list[tuple[Any, tuple, float]] = []
    self._running: dict[Any, tuple[_Worker, Any]] = {}
    self._done: list[tuple[Any, Outcome]] = []
    self._next_index = 0
    self._lock = threading.Condition()
    self._dispatcher: threading.Thread | None = None
    self._wake_r, self._wake_w = None, None

  @property
  def settings(self) -> tuple:
    return self.fn, self.num_workers, self.memory_mb, self.max_calls

  def _spawn(self) -> _Worker:
    return _Worker(self._ctx, self.fn, self.memory_mb)

  def map(self, calls: Sequence[tuple], *, timeout_s: float) -> list[Outcome]:
    """``[fn(*args) for args in calls]`` as Outcomes, in order; each call gets ``timeout_s``."""
    if self.in_flight:
      raise RuntimeError("VerifierPool.map while asynchronous calls are in flight: poll() them "
                         "first (the two would share the workers)")
    n = len(calls)
    outcomes: list[Outcome | None] = [None] * n
    while len(self._workers) < min(self.num_workers, n):
      self._workers.append(self._spawn())
    pending = list(range(n - 1, -1, -1))  # a stack: pop() gives 0, 1, ...
    idle = list(self._workers)
    busy: dict[Any, _Worker] = {}
    remaining = n
    while remaining:
      while idle and pending:
        worker, index = idle.pop(), pending.pop()
        try:
          worker.conn.send((index, calls[index]))
        except (BrokenPipeError, OSError):  # died between batches: replace and retry the call
          pending.append(index)
          idle.append(self._replace(worker))
          continue
        worker.task, worker.deadline = index, time.monotonic() + timeout_s
        busy[worker.conn] = worker
      wait_s = max(min(w.deadline for w in busy.values()) - time.monotonic(), 0.0)
      for conn in connection.wait(list(busy), timeout=wait_s):
        worker = busy.pop(conn)
        outcomes[worker.task], verdict = worker.receive()
        idle.append(self._after_call(worker, verdict))
        remaining -= 1
      now = time.monotonic()
      for conn, worker in list(busy.items()):
        if now >= worker.deadline:
          busy.pop(conn)
          outcomes[worker.task] = Outcome("timeout")
          idle.append(self._replace(worker))
          remaining -= 1
    return outcomes

  # --- asynchronous calls: a caller that overlaps them with its own work (the multi-turn
  # engine decodes other rows while an environment steps) submits each call when it is ready
  # and collects the answers as they come, in whatever order they finish. A worker that
  # answers takes the next queued call at once (the dispatcher thread), not at the caller's next
  # ``poll``: the engine polls between its decode calls, and a worker idle until then lost
  # several ms of every tool step.

  @property
  def in_flight(self) -> int:
    """Submitted calls not yet returned by ``poll``."""
    with self._lock:
      return len(self._queue) + len(self._running) + len(self._done)

  def submit(self, tag, args: tuple, *, timeout_s: float) -> None:
    """Start ``fn(*args)`` on an idle worker (or queue it); ``poll`` returns it with ``tag``.
    Its ``timeout_s`` counts from when a worker takes it."""
    with self._lock:
      self._queue.append((tag, tuple(args), float(timeout_s)))
      self._dispatch()
      if self._dispatcher is None:
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        self._dispatcher = threading.Thread(target=self._dispatch_forever, daemon=True,
                                            name="rljax-pool-dispatcher")
        self._dispatcher.start()
    self._wake_w.send_bytes(b"")  # the dispatcher waits on the new call's worker too

  def _dispatch(self) -> None:
    """Queued calls to idle workers (spawned up to ``workers``); the lock is held."""
    while len(self._workers) < self.num_workers and len(self._workers) < self.in_flight:
      self._workers.append(self._spawn())
    busy = {id(w) for w, _ in self._running.values()}
    idle = [w for w in self._workers if id(w) not in busy]
    while idle and self._queue:
      worker = idle.pop()
      tag, args, timeout_s = self._queue.pop(0)
      index, self._next_index = self._next_index, self._next_index + 1
      try:
        worker.conn.send((index, args))
      except (BrokenPipeError, OSError):  # died while idle: replace it, the call goes again
        self._queue.insert(0, (tag, args, timeout_s))
        idle.append(self._replace(worker))
        continue
      worker.task, worker.deadline = index, time.monotonic() + timeout_s
      self._running[worker.conn] = (worker, tag)

  def _dispatch_forever(self) -> None:
    """The dispatcher thread: answers and deadlines of running calls, then queued calls to the
    workers they freed, until ``close``."""
    while True:
      with self._lock:
        if self._wake_r is None:
          return
        waiting = list(self._running) + [self._wake_r]
        deadline = min((w.deadline for w, _ in self._running.values()), default=None)
      wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
      try:
        ready = connection.wait(waiting, timeout=wait)
      except OSError:  # closed under us by ``close``
        return
      with self._lock:
        if self._wake_r is None:
          return
        before = len(self._done)
        for conn in ready:
          if conn is self._wake_r:
            while self._wake_r.poll():
              self._wake_r.recv_bytes()
          elif conn in self._running:
            worker, tag = self._running.pop(conn)
            outcome, verdict = worker.receive()
            self._after_call(worker, verdict)
            self._done.append((tag, outcome))
        now = time.monotonic()
        for conn, (worker, tag) in list(self._running.items()):
          if now >= worker.deadline:
            self._running.pop(conn)
            self._replace(worker)
            self._done.append((tag, Outcome("timeout")))
        self._dispatch()
        if len(self._done) > before:
          self._lock.notify_all()

  def poll(self, wait_s: float = 0.0) -> list[tuple[Any, Outcome]]:
    """``(tag, Outcome)`` of the calls that finished (or timed out) since the last poll,
    waiting up to ``wait_s`` seconds for the first one when none has."""
    with self._lock:
      if not self._done and (self._queue or self._running) and wait_s > 0:
        self._lock.wait(wait_s)
      done, self._done = self._done, []
      return done

  def _after_call(self, worker: _Worker, verdict: str) -> _Worker:
    """The worker that serves the next call: this one, or a fresh one."""
    if verdict == "broken":
      return self._replace(worker)
    if verdict == "retire" or (self.max_calls and worker.calls >= self.max_calls):
      self.recycled += 1
      return self._replace(worker, count=False)
    return worker

  def _replace(self, worker: _Worker, count: bool = True) -> _Worker:
    worker.kill()
    fresh = self._spawn()
    self._workers[self._workers.index(worker)] = fresh
    self.replaced += count
    return fresh

  def close(self) -> None:
    with self._lock:
      wake, self._wake_r = self._wake_r, None
      if wake is not None:
        self._wake_w.send_bytes(b"")
    if self._dispatcher is not None:
      self._dispatcher.join(timeout=5)
      wake.close()
      self._wake_w.close()
      self._dispatcher = None
    with self._lock:
      for worker in self._workers:
        worker.kill()
      self._workers = []
      self._queue, self._running, self._done = [], {}, []


_POOL: VerifierPool | None = None


def shared_pool(fn: Callable[..., Any], workers: int, max_worker_memory_mb: int = 0,
                worker_max_calls: int = 0) -> VerifierPool:
  """The process-wide pool for these settings: reused across steps (the workers are forked
  once); other settings replace it (forked anew, so the workers see a newly defined function)."""
  global _POOL
  settings = (fn, workers, max_worker_memory_mb, worker_max_calls)
  if _POOL is None or _POOL.settings != settings:
    if _POOL is not None:
      _POOL.close()
    else:
      atexit.register(close_shared_pool)  # before multiprocessing's own exit hook joins them
    _POOL = VerifierPool(*settings)
  return _POOL


def current_pool() -> VerifierPool | None:
  """The shared pool, if one was made (for tests and diagnostics)."""
  return _POOL


def close_shared_pool() -> None:
  """Kill the shared pool's workers with their process groups and trees (at exit, and by a
  trainer leaving on a signal)."""
  if _POOL is not None:
    _POOL.close()


def run_isolated(fn: Callable[..., Any], calls: Sequence[tuple], *, timeout_s: float,
                 workers: int, max_worker_memory_mb: int = 0,
                 worker_max_calls: int = 0) -> list[Outcome]:
  """``fn(*args)`` for each ``args`` in ``calls`` in the shared worker processes; with
  ``workers=0`` in this process, one after another: no process to kill, so no timeout, and an
  exception becomes an 'error' Outcome as in a worker (KeyboardInterrupt still stops the run)."""
  if not calls:
    return []
  if workers == 0:
    return [_call_here(fn, args) for args in calls]
  pool = shared_pool(fn, workers, max_worker_memory_mb, worker_max_calls)
  return pool.map(calls, timeout_s=timeout_s)

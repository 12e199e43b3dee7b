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
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import time
import warnings
from multiprocessing import connection
from typing import Any, Callable, Sequence

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
  import ctypes
  try:
    return ctypes.CDLL("libc.so.6", use_errno=True)
  except OSError:
    return None


_LIBC = _load_libc()


def _die_with_parent() -> None:
  """Linux: the kernel kills this worker when the trainer dies (kill -9 included), so a verifier
  stuck in a loop never outlives the run."""
  if _LIBC is not None:
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _worker_main(conn, fn: Callable[..., Any]) -> None:
  """Worker loop: receive ``(index, args)``, answer ``(index, status, value)``; EOF ends it."""
  _die_with_parent()
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
  # A handler inherited from the trainer (jax.distributed installs one for preemption) would
  # keep SIGTERM from ending the worker, and the trainer's exit waits for its workers.
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  while True:
    try:
      index, args = conn.recv()
    except (EOFError, OSError):
      return
    try:
      reply = (index, "ok", fn(*args))
    except Exception as e:  # a verifier bug is one failed call, not a dead worker
      reply = (index, "error", f"{type(e).__name__}: {e}"[:500])
    try:
      conn.send(reply)
    except Exception as e:  # an unpicklable return value
      conn.send((index, "error", f"result not transferable: {type(e).__name__}: {e}"[:500]))


def _start_method() -> str:
  return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class _Worker:
  def __init__(self, ctx, fn):
    self.conn, child = ctx.Pipe(duplex=True)
    with warnings.catch_warnings():
      # Python 3.12 and JAX warn on fork in a threaded process: the child runs only the
      # verifier's Python (no JAX, no thread-owned lock of the trainer), and a child that did
      # deadlock would be killed at its deadline and replaced like any hung verifier.
      warnings.simplefilter("ignore", DeprecationWarning)
      warnings.simplefilter("ignore", RuntimeWarning)
      self.process = ctx.Process(target=_worker_main, args=(child, fn), daemon=True,
                                 name="rljax-verifier")
      self.process.start()
    child.close()
    self.task: int | None = None
    self.deadline = 0.0

  def kill(self) -> None:
    if self.process.is_alive():
      os.kill(self.process.pid, signal.SIGKILL)
    self.process.join(timeout=5)
    self.conn.close()


class VerifierPool:
  """``workers`` processes running ``fn``; ``map`` runs a batch of calls with a per-call timeout.

  Args:
    fn: the function every call runs (``fn(*args)``).
    workers: number of worker processes (>= 1).
  """

  def __init__(self, fn: Callable[..., Any], workers: int):
    if workers < 1:
      raise ValueError(f"reward.workers={workers} must be >= 1")
    self.fn, self.num_workers = fn, workers
    self._ctx = multiprocessing.get_context(_start_method())
    self._workers: list[_Worker] = []
    self.replaced = 0  # workers killed after a timeout or found dead (for tests and logs)

  def _spawn(self) -> _Worker:
    return _Worker(self._ctx, self.fn)

  def map(self, calls: Sequence[tuple], *, timeout_s: float) -> list[Outcome]:
    """``[fn(*args) for args in calls]`` as Outcomes, in order; each call gets ``timeout_s``."""
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
        try:
          index, status, value = conn.recv()
          outcomes[index] = Outcome(status, value)
          idle.append(worker)
        except (EOFError, OSError):  # the worker died mid-call (os._exit, segfault, OOM kill)
          outcomes[worker.task] = Outcome("error", "verifier process died")
          idle.append(self._replace(worker))
        remaining -= 1
      now = time.monotonic()
      for conn, worker in list(busy.items()):
        if now >= worker.deadline:
          busy.pop(conn)
          outcomes[worker.task] = Outcome("timeout")
          idle.append(self._replace(worker))
          remaining -= 1
    return outcomes

  def _replace(self, worker: _Worker) -> _Worker:
    worker.kill()
    fresh = self._spawn()
    self._workers[self._workers.index(worker)] = fresh
    self.replaced += 1
    return fresh

  def close(self) -> None:
    for worker in self._workers:
      worker.kill()
    self._workers = []


_POOL: VerifierPool | None = None


def shared_pool(fn: Callable[..., Any], workers: int) -> VerifierPool:
  """The process-wide pool for ``fn``: reused across steps (the workers are forked once); a call
  with another function or worker count replaces it (forked anew, so it sees that function)."""
  global _POOL
  if _POOL is None or _POOL.fn != fn or _POOL.num_workers != workers:
    if _POOL is not None:
      _POOL.close()
    else:
      atexit.register(_close_shared_pool)  # before multiprocessing's own exit hook joins them
    _POOL = VerifierPool(fn, workers)
  return _POOL


def _close_shared_pool() -> None:
  if _POOL is not None:
    _POOL.close()


def run_isolated(fn: Callable[..., Any], calls: Sequence[tuple], *, timeout_s: float,
                 workers: int) -> list[Outcome]:
  """``fn(*args)`` for each ``args`` in ``calls`` in the shared worker processes."""
  if not calls:
    return []
  return shared_pool(fn, workers).map(calls, timeout_s=timeout_s)

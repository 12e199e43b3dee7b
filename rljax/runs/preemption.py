"""SIGTERM (preemption) ends a run at a step boundary with a checkpoint; SIGINT ends it quietly.

A preemptible TPU VM or a cluster scheduler sends SIGTERM, then SIGKILL some seconds later.
During ``train`` the SIGTERM handler turns the signal into a request to stop:

* In the parts of a step that can be dropped because they leave the train state untouched (start-
  up, the rollout with its verifiers, the eval before and after training), the handler raises
  ``Preempted`` at once: the step in flight is abandoned.
* Elsewhere (the donated ``train_step``, a metrics write, a checkpoint save, a mid-run eval) it
  is only noted, and the loop stops when the step has ended.

Either way the state saved is the last end-of-step state, with the data position recorded when
that step ended, so a resumed run replays exactly the steps it has not done. The save is forced
(committed before exit) and the process exits 0 with one line. ``train.preempt_grace_s`` counts
from the signal: if the in-flight work and the save are not done by then, one line says so and
the process exits 1 (the previous checkpoint is intact: orbax commits atomically).

SIGINT (Ctrl-C) stops at once without saving: pending saves are completed, the run directory's
lock is released and one line names the last checkpoint. The verifier workers ignore SIGINT (and
sit in their own process group, out of the terminal's reach); they are killed by the trainer.

Only the main thread can install signal handlers; ``train`` called from another thread runs
without this guard. One process per run: on a multi-host run each host would stop at its own
point, out of step with the others' collectives.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from rljax.rewards import isolation

RESUME_HINT = "resume with --config.train.resume=True"


class Preempted(BaseException):
  """Raised in the main thread to abandon the work in flight (a BaseException: a user's
  ``except Exception`` on the way up must not swallow it)."""


class Stop(BaseException):
  """Ends the command: ``cli.entry`` prints ``line`` (one line) and exits with ``code``."""

  def __init__(self, line: str, code: int):
    super().__init__(line)
    self.line, self.code = line, code


class Guard:
  """The state of one run's signal handling (see the module docstring)."""

  def __init__(self, run_dir: str, grace_s: float):
    self.run_dir, self.grace_s = run_dir, grace_s
    self.requested: str | None = None  # the signal's name once SIGTERM arrived
    self.step = 0  # steps done by the state the run holds between steps
    self.extra: dict | None = None  # the checkpoint's extra (data position) at that step
    self._droppable = False
    self._watchdog: threading.Timer | None = None

  def _on_sigterm(self, signum, frame) -> None:
    if self.requested:  # a second SIGTERM while stopping: the first one's deadline holds
      return
    self.requested = "SIGTERM"
    self._watchdog = threading.Timer(self.grace_s, self._out_of_time)
    self._watchdog.daemon = True
    self._watchdog.start()
    if self._droppable:
      self._droppable = False
      raise Preempted()

  def _out_of_time(self) -> None:
    """The grace period is over and the checkpoint is not committed: say so and leave before
    the scheduler's SIGKILL cuts the line off."""
    line = (f"preempted (SIGTERM) at step {self.step}: the checkpoint was not saved within "
            f"train.preempt_grace_s={self.grace_s:g} s; {RESUME_HINT} restarts from the last "
            f"complete checkpoint in {os.path.join(self.run_dir, 'checkpoints')}\n")
    os.write(2, line.encode())
    with contextlib.suppress(BaseException):
      isolation.close_shared_pool()  # no atexit after os._exit: the workers' groups go now
    os._exit(1)

  @contextlib.contextmanager
  def droppable(self):
    """A block that SIGTERM may abandon (it must not change the train state)."""
    self._droppable = True  # before the check: a signal between the two still interrupts
    try:
      self.check()
      yield
    finally:
      self._droppable = False

  def check(self) -> None:
    """Raise ``Preempted`` if SIGTERM arrived: called where the state is an end-of-step state."""
    if self.requested:
      raise Preempted()

  def at_step(self, step: int, extra: dict) -> None:
    """The run holds the state after ``step`` steps; ``extra`` is what its checkpoint records."""
    self.step, self.extra = step, extra
    self.check()

  def stop(self, run, reason: BaseException) -> Stop:
    """What ends the command after ``Preempted`` or ``KeyboardInterrupt``: for SIGTERM the state
    of ``self.step`` is saved first. ``run`` is None when start-up was interrupted."""
    if isinstance(reason, KeyboardInterrupt):
      with _sigint_ignored():  # a second Ctrl-C would tear the pending save (kill -9 still works)
        _close(run)
      return Stop(f"interrupted (SIGINT) at step {self.step}: not saved past the last checkpoint "
                  f"in {os.path.join(self.run_dir, 'checkpoints')}; {RESUME_HINT}", 130)
    saved = run is not None and self.step > 0 and run.checkpointer is not None
    if saved:
      run.checkpointer.save(self.step, run.state, self.extra, force=True)  # no-op if it exists
    _close(run)
    if self._watchdog is not None:
      self._watchdog.cancel()
    where = os.path.join(self.run_dir, "checkpoints")
    if run is None:
      return Stop(f"preempted (SIGTERM) during start-up: nothing to save; {RESUME_HINT}", 0)
    if saved:
      return Stop(f"preempted (SIGTERM) at step {self.step}: checkpoint saved in {where}; "
                  f"{RESUME_HINT}", 0)
    return Stop(f"preempted (SIGTERM) at step {self.step}: no step had ended, nothing to save; "
                f"{RESUME_HINT}", 0)


@contextlib.contextmanager
def _sigint_ignored():
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)


def _close(run) -> None:
  """Complete pending saves and close the sinks (the lock is released by the caller)."""
  if run is None:
    return
  if run.checkpointer is not None:
    run.checkpointer.close()
  run.writer.close()


@contextlib.contextmanager
def guard(run_dir: str, grace_s: float):
  """Handle SIGTERM for the life of the block (module docstring); yields the ``Guard``."""
  state = Guard(run_dir, grace_s)
  if threading.current_thread() is not threading.main_thread():
    yield state
    return
  previous = signal.signal(signal.SIGTERM, state._on_sigterm)
  try:
    yield state
  finally:
    signal.signal(signal.SIGTERM, previous)
    if state._watchdog is not None:
      state._watchdog.cancel()

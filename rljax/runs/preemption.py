"""SIGTERM (preemption) ends a run at a step boundary with a checkpoint; SIGINT ends it quietly.

One path for every command that trains: the RL loop (``rljax train``), the SFT cold start
(``rljax sft``, and inside ``train``) and reward-model training (``rljax rm``). Each is a
``preemptible`` block that declares, once its state exists, how to save a step
(``Guard.attach``) and marks its step boundaries (``Guard.at_step``).

A preemptible TPU VM or a cluster scheduler sends SIGTERM, then SIGKILL some seconds later.
Inside such a block the SIGTERM handler turns the signal into a request to stop:

* In the parts of a step that can be dropped because they leave the state untouched (start-up,
  the rollout with its verifiers, an eval before and after training), the handler raises
  ``Preempted`` at once: the step in flight is abandoned.
* Elsewhere (the donated update, a metrics write, a checkpoint save, a mid-run eval) it is only
  noted, and the loop stops when the step has ended.

Either way the state saved is the last end-of-step state, with the data position recorded when
that step ended, so a resumed run replays exactly the steps it has not done. The save is forced
(committed before exit) and the process exits 0 with one line. The grace period counts from the
signal: if the in-flight work and the save are not done by then, one line says so and the
process exits 1 (the previous checkpoint is intact: orbax commits atomically).

Blocks nest: the SFT cold start that ``train`` runs while it builds the run is a block inside the
run's, which is droppable there. The innermost block saves its own step and ends the command
(its line names it: ``in the SFT cold start``); the blocks around it only close their sinks.

SIGINT (Ctrl-C) stops at once without saving: pending saves are completed, the run directory's
lock is released and one line names the last checkpoint. The verifier workers ignore SIGINT (and
sit in their own process group, out of the terminal's reach); they are killed by the trainer.

Only the main thread can install signal handlers; a block entered from another thread runs
without this guard. One process per run: on a multi-host run each host would stop at its own
point, out of step with the others' collectives.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable

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
  """The signal handling of one preemptible block (module docstring). ``checkpoints``: the
  directory its lines name; ``what``: the block's name in them (``'in the SFT cold start '``,
  ``''`` for a run); ``hint``: how to continue (default: as the enclosing block, else
  ``RESUME_HINT``)."""

  def __init__(self, run_dir: str, grace_s: float, *, checkpoints: str | None = None,
               what: str = "", hint: str | None = None, outer: "Guard | None" = None):
    self.run_dir, self.grace_s, self.what = run_dir, grace_s, what
    # A block inside another is continued by continuing the outer one.
    self.hint = hint or (outer.hint if outer is not None else RESUME_HINT)
    self.checkpoints = checkpoints or os.path.join(run_dir, "checkpoints")
    self.outer = outer
    self._requested: str | None = None  # the signal's name once SIGTERM arrived (outermost)
    self.step = 0  # steps done by the state the block holds between steps
    self.extra: dict | None = None  # the checkpoint's extra (data position) at that step
    self._save: Callable[[int, dict | None], None] | None = None
    self._close: Callable[[], None] = lambda: None
    self.attached = False
    self._droppable = False
    self._watchdog: threading.Timer | None = None

  @property
  def requested(self) -> str | None:
    return self.outer.requested if self.outer is not None else self._requested

  def attach(self, save: Callable[[int, dict | None], None] | None,
             close: Callable[[], None]) -> None:
    """The block's state exists: ``save(step, extra)`` commits the state it holds as checkpoint
    ``step`` (None: it keeps none); ``close()`` completes pending saves and closes its sinks."""
    self._save, self._close, self.attached = save, close, True

  def _on_sigterm(self, signum, frame) -> None:
    if self._requested:  # a second SIGTERM while stopping: the first one's deadline holds
      return
    self._requested = "SIGTERM"
    self._watchdog = threading.Timer(self.grace_s, self._out_of_time)
    self._watchdog.daemon = True
    self._watchdog.start()
    inner = _innermost(self)
    if inner._droppable:
      inner._droppable = False
      raise Preempted()

  def _out_of_time(self) -> None:
    """The grace period is over and the checkpoint is not committed: say so and leave before
    the scheduler's SIGKILL cuts the line off."""
    inner = _innermost(self)
    line = (f"preempted (SIGTERM) {inner.what}at step {inner.step}: the checkpoint was not saved "
            f"within train.preempt_grace_s={self.grace_s:g} s; {inner.hint} restarts from the "
            f"last complete checkpoint in {inner.checkpoints}\n")
    os.write(2, line.encode())
    with contextlib.suppress(BaseException):
      isolation.close_shared_pool()  # no atexit after os._exit: the workers' groups go now
    os._exit(1)

  @contextlib.contextmanager
  def droppable(self):
    """A block that SIGTERM may abandon (it must not change the state a save would write)."""
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

  def at_step(self, step: int, extra: dict | None) -> None:
    """The block holds the state after ``step`` steps; ``extra`` is what its checkpoint records."""
    self.step, self.extra = step, extra
    self.check()

  def close(self) -> None:
    """Complete pending saves and close the sinks (the lock is released by the caller)."""
    if self.attached:
      self._close()

  def stop(self, reason: BaseException) -> Stop:
    """What ends the command after ``Preempted`` or ``KeyboardInterrupt``: for SIGTERM the state
    of ``self.step`` is saved first."""
    if isinstance(reason, KeyboardInterrupt):
      with _sigint_ignored():  # a second Ctrl-C would tear the pending save (kill -9 still works)
        self.close()
      return Stop(f"interrupted (SIGINT) {self.what}at step {self.step}: not saved past the last "
                  f"checkpoint in {self.checkpoints}; {self.hint}", 130)
    saved = self.attached and self.step > 0 and self._save is not None
    if saved:
      self._save(self.step, self.extra)  # forced and committed; a no-op if it exists
    self.close()
    root = self
    while root.outer is not None:
      root = root.outer
    if root._watchdog is not None:  # saved in time: the deadline is off
      root._watchdog.cancel()
    if not self.attached:
      return Stop(f"preempted (SIGTERM) {self.what or ''}during start-up: nothing to save; "
                  f"{self.hint}", 0)
    if saved:
      return Stop(f"preempted (SIGTERM) {self.what}at step {self.step}: checkpoint saved in "
                  f"{self.checkpoints}; {self.hint}", 0)
    return Stop(f"preempted (SIGTERM) {self.what}at step {self.step}: no step had ended, nothing "
                f"to save; {self.hint}", 0)


_ACTIVE: list[Guard] = []  # the preemptible blocks the main thread is in, outermost first


def _innermost(guard: Guard) -> Guard:
  return _ACTIVE[-1] if _ACTIVE else guard


def active() -> Guard | None:
  """The innermost preemptible block the main thread is in (None outside any)."""
  return _ACTIVE[-1] if _ACTIVE else None


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


@contextlib.contextmanager
def guard(run_dir: str, grace_s: float, **kwargs):
  """Handle SIGTERM for the life of the block (module docstring); yields its ``Guard``. Inside
  another block it nests (the outer one keeps the handler, and a droppable outer block is not
  droppable here)."""
  if threading.current_thread() is not threading.main_thread():
    yield Guard(run_dir, grace_s, **kwargs)
    return
  outer = active()
  state = Guard(run_dir, grace_s, outer=outer, **kwargs)
  if outer is None:
    previous = signal.signal(signal.SIGTERM, state._on_sigterm)
  _ACTIVE.append(state)
  try:
    yield state
  finally:
    _ACTIVE.remove(state)
    if outer is None:
      signal.signal(signal.SIGTERM, previous)
      if state._watchdog is not None:
        state._watchdog.cancel()


@contextlib.contextmanager
def preemptible(run_dir: str, grace_s: float, *, after: Callable[[], None] = lambda: None,
                **kwargs):
  """A ``guard`` block that ends the command as the module docstring says: ``Preempted`` or
  Ctrl-C inside it save (SIGTERM) and close the block's state, run ``after()`` (e.g. join a
  sampler thread) and raise ``Stop``; a ``Stop`` of a block inside it, or any other exception,
  closes it (pending saves completed, never left half-written) and goes on up."""
  with guard(run_dir, grace_s, **kwargs) as state:
    try:
      yield state
    except (Preempted, KeyboardInterrupt) as reason:
      stop = state.stop(reason)
      after()
      raise stop from None
    except BaseException:
      state.close()
      after()
      raise

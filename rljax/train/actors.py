"""The sampler / learner seam (DESIGN.md, "Seams, not names"): who produces rollout batches, who
consumes them, and how weights travel between the two.

* A ``BatchSampler`` holds a policy version and hands out one ``Batch`` per step, tagged with the
  version (learner steps done) of the weights that sampled it. ``publish`` gives it the
  learner's newest weights.
* A ``Learner`` consumes a ``Batch`` and updates the weights (``rljax.train.loop.RunLearner``).

``rljax.train.loop`` composes the two and names neither implementation:

* ``SyncSampler`` (``rollout.max_staleness=0``, the default) samples step s's batch on demand
  with the weights after s steps: the synchronous loop, the same computation as before the seam.
* ``AsyncSampler`` (``rollout.max_staleness=K > 0``) samples in a background thread, ahead of the
  learner, always with the newest weights published, and starts step s's batch only once the
  learner has done at least s - K steps: every batch is at most K updates stale (AReaL, arXiv
  2505.24298, bounds staleness the same way; K = 1 is verl's one-step-off-policy pipeline and
  PipelineRL's lag without in-flight updates). Sampling (JAX releases the GIL while a compiled
  call runs, the verifiers run in worker processes) then overlaps the learner's update.

The importance ratio of the stale samples is what the rollout correction (``algo.rollout_is`` /
``rollout_rs``, docs/algorithms.md#transform-rollout_correction) already corrects: rljax
recomputes ``old_logp`` with the learner's weights, so ``sampler -> old`` covers both the
numerical mismatch and the staleness (with ``algo.rollout_is_over_cap='mask'``, AReaL's decoupled
PPO objective; 'truncate', verl's TIS). Both samplers sample through the run's rollout engine
(``rljax.rollout.engines``): ``publish`` hands the learner's weights to ``engine.transfer``
(copied to the sampler's devices with ``mesh.sampler_devices``, measured in bytes and seconds per
transfer), and a batch starts by ``engine.load_weights`` of the version it is sampled with.

Resume (docs/async.md): the checkpoint at step s holds the learner's state and the data position
after the last batch it *consumed* (``Batch.data``), not after what the sampler drew ahead. A
resumed run drops the queue and its sampler starts again at step s with the weights of step s,
drawing the same prompts with the same ``fold_in(PRNGKey(seed), stream, step, round)`` keys: no
prompt is trained on twice and none is lost; only the batches in flight at the kill are sampled
again, with fresher weights.
"""
from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
import weakref
from typing import Any, Callable, Optional, Protocol


from rljax.rollout.engines import RolloutEngine
from rljax.rollout.record import Rollout


@dataclasses.dataclass(frozen=True)
class Batch:
  """One step's rollout batch as the sampler hands it to the learner.

  step: the learner step that will consume it.
  version: learner steps done by the weights that sampled it (staleness = step - version).
  rollout: the host ``Rollout`` (rewards and validity added).
  info: the rollout's metrics (``rljax.train.loop.collect_batch``).
  data: the prompt source's ``state_dict()`` right after this batch's prompts were drawn; what a
    checkpoint records once the learner has consumed the batch.
  sec_rollout: seconds the sampler spent on it.
  """
  step: int
  version: int
  rollout: Rollout
  info: dict
  data: dict
  sec_rollout: float


class BatchSampler(Protocol):
  def next(self, step: int) -> Batch:
    """Step ``step``'s batch (blocks until it is ready); steps are asked for in order."""

  def publish(self, params, version: int) -> dict:
    """The learner's weights after ``version`` steps; returns the transfer's metrics."""

  def queued(self) -> int:
    """Batches sampled and waiting for the learner."""

  def idle(self) -> contextlib.AbstractContextManager:
    """A block during which no batch is being sampled (the eval shares the verifier workers
    and the environments, which serve one caller at a time)."""

  def close(self, wait: bool = True) -> None:
    """Stop sampling ahead and release what it holds (called on every exit); ``wait``: until
    whatever it runs in the background has ended."""


class Learner(Protocol):
  def learn(self, batch: Batch) -> dict:
    """Update the weights on ``batch``; the step's metrics."""

  @property
  def params(self) -> Any:
    """The newest weights (a pytree on the learner's devices)."""


# --- the synchronous sampler --------------------------------------------------------------------

# (step, params, newest) -> (rollout, info). ``newest``: None, or with in-flight weight updates
# (``rollout.inflight_chunk``) ``() -> (version, params)``, the newest weights published, which
# the rollout reads between its chunks (``rljax.rollout.inflight``).
Collect = Callable[[int, Any, Optional[Callable[[], tuple[int, Any]]]], tuple[Rollout, dict]]


class SyncSampler:
  """``rollout.max_staleness=0``: step s's batch is sampled when the learner asks for it, with
  the weights after s steps (staleness 0)."""

  def __init__(self, collect: Collect, source_state: Callable[[], dict], engine: RolloutEngine,
               params, version: int):
    self._collect, self._source_state, self._engine = collect, source_state, engine
    self._params, self._version = engine.transfer(params)[0], version

  def next(self, step: int) -> Batch:
    t0 = time.perf_counter()
    self._engine.load_weights(self._params, self._version)
    rollout, info = self._collect(step, self._params, None)
    return Batch(step, self._version, rollout, info, self._source_state(),
                 time.perf_counter() - t0)

  def publish(self, params, version: int) -> dict:
    self._params, metrics = self._engine.transfer(params)
    self._version = version
    return metrics

  def queued(self) -> int:
    return 0

  def idle(self):
    return contextlib.nullcontext()

  def close(self, wait: bool = True) -> None:
    self._params = None


# --- the asynchronous sampler -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Failed:
  error: BaseException


class AsyncSampler:
  """``rollout.max_staleness=K > 0``: a background thread samples steps ``start, start + 1,
  ...`` in order, each with the newest published weights, and starts step s only once they are
  of version >= s - K (so a batch is at most K updates stale when the learner takes it). Batches
  wait in a host queue of ``K + 1`` (the most the version bound lets the thread get ahead).

  The thread owns the prompt source and the verifier workers while it runs (they are stateful
  and serve one caller at a time); the eval borrows them through ``idle()``. An error in the
  thread is raised by the learner's next ``next()``.
  """

  POLL_S = 0.1  # how often blocked waits look for ``close`` (and let signals through)

  def __init__(self, collect: Collect, source_state: Callable[[], dict], engine: RolloutEngine,
               params, *, start: int, steps: int, max_staleness: int, inflight: bool = False):
    if max_staleness < 1:
      raise ValueError(f"rollout.max_staleness={max_staleness}: the asynchronous sampler needs "
                       ">= 1 (0 is the synchronous loop)")
    self.max_staleness, self.inflight = max_staleness, inflight
    self._collect, self._source_state, self._engine = collect, source_state, engine
    self._cond = threading.Condition()
    self._latest = (start, engine.transfer(params)[0])  # (version, weights the engine reads)
    self._queue: queue.Queue = queue.Queue(maxsize=max_staleness + 1)
    self._busy = threading.Lock()  # held while a batch is sampled
    self._stopped = False
    self._thread = threading.Thread(target=self._run, args=(start, steps), daemon=True,
                                    name="rljax-sampler")
    self._thread.start()
    _LIVE.add(self)

  def _run(self, start: int, steps: int) -> None:
    try:
      for step in range(start, steps):
        with self._cond:
          self._cond.wait_for(
              lambda: self._stopped or self._latest[0] >= step - self.max_staleness)
          if self._stopped:
            return
          version, params = self._latest
        with self._busy:
          t0 = time.perf_counter()
          self._engine.load_weights(params, version)
          rollout, info = self._collect(step, params, self._newest if self.inflight else None)
          batch = Batch(step, version, rollout, info, self._source_state(),
                        time.perf_counter() - t0)
        del params  # the next publish may free these weights
        if not self._put(batch):
          return
    except BaseException as e:  # raised in the learner's thread by next()
      self._put(_Failed(e))

  def _newest(self) -> tuple[int, Any]:
    """The newest published weights, read by an in-flight rollout between its chunks."""
    with self._cond:
      version, params = self._latest
    if params is None:
      raise RuntimeError("the sampler was closed during an in-flight rollout")
    return version, params

  def _put(self, item) -> bool:
    while not self._stopped:
      try:
        self._queue.put(item, timeout=self.POLL_S)
        return True
      except queue.Full:
        pass
    return False

  def next(self, step: int) -> Batch:
    while True:
      try:
        item = self._queue.get(timeout=self.POLL_S)
        break
      except queue.Empty:
        if not self._thread.is_alive() and self._queue.empty():
          raise RuntimeError(f"the sampler thread ended before step {step}'s batch") from None
    if isinstance(item, _Failed):
      raise item.error
    if item.step != step:
      raise RuntimeError(f"the sampler handed step {item.step}'s batch to step {step}")
    return item

  def queued(self) -> int:
    """Batches ready and waiting."""
    return self._queue.qsize()

  def publish(self, params, version: int) -> dict:
    placed, metrics = self._engine.transfer(params)
    with self._cond:
      self._latest = (version, placed)
      self._cond.notify_all()
    return metrics

  @contextlib.contextmanager
  def idle(self):
    with self._busy:
      yield

  def close(self, wait: bool = True) -> None:
    """Stop the thread after the batch it is sampling (its queue is dropped); ``wait``: join it
    (an exception on its way up does not wait: a preemption saves its checkpoint first, then
    ``join_stopped``)."""
    with self._cond:
      self._stopped = True
      self._latest = (self._latest[0], None)
      self._cond.notify_all()
    while True:  # unblock a put
      try:
        self._queue.get_nowait()
      except queue.Empty:
        break
    if wait:
      self._thread.join()


_LIVE: "weakref.WeakSet[AsyncSampler]" = weakref.WeakSet()


def join_stopped(timeout_s: float) -> None:
  """Wait (at most ``timeout_s`` in all) for closed samplers' threads to end their batch, so the
  process does not exit while one is inside a compiled call or a verifier."""
  deadline = time.monotonic() + timeout_s
  for sampler in list(_LIVE):
    sampler._thread.join(max(deadline - time.monotonic(), 0.0))


def make_batch_sampler(max_staleness: int, collect: Collect, source_state: Callable[[], dict],
                       engine: RolloutEngine, params, *, start: int, steps: int,
                       inflight: bool = False) -> BatchSampler:
  """The synchronous sampler for ``rollout.max_staleness=0``, else the asynchronous one
  (``inflight``: its rollouts take newer weights between chunks), both through ``engine``
  starting from the learner's ``params``."""
  if max_staleness == 0:
    return SyncSampler(collect, source_state, engine, params, start)
  return AsyncSampler(collect, source_state, engine, params, start=start, steps=steps,
                      max_staleness=max_staleness, inflight=inflight)


def uncorrected_staleness_warning(max_staleness: int, corrected: bool) -> Optional[str]:
  """The one-line start-up warning of an asynchronous run whose stale samples no rollout
  correction (``algo.rollout_is`` / ``algo.tis_cap`` / ``algo.rollout_rs*``) covers, nor a PPO
  ratio against the sampling policy (``algo.old_logp='sampler'``); None when the loop is
  synchronous or one of them is on. A warning, not a refusal: training on stale
  samples uncorrected is a legitimate setting (verl's one-step-off-policy default), and the PPO
  ratio stays anchored on the recomputed ``old_logp``; only the gradient is biased by the
  behaviour/learner gap (docs/async.md)."""
  if max_staleness == 0 or corrected:
    return None
  return (f"warning: rollout.max_staleness={max_staleness} with no rollout correction: batches "
          f"up to {max_staleness} update(s) stale are trained as if the current policy had "
          "sampled them; set algo.rollout_is (or algo.rollout_rs) to correct them "
          "(docs/async.md)")

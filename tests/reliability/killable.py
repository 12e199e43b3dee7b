"""``python -m tests.reliability.killable POINT rljax-args...``: ``rljax`` that SIGKILLs itself at
POINT (or pauses there), for the fault-injection tests.

Before dying it writes ``KILLED <point>`` to stderr, so the test knows the point was reached.

  sft:K       at the K-th SFT batch
  rm:K        at the K-th batch of a reward model's training (`rljax rm`, the RLHF cold start)
  compile:S   S seconds into the first train-step call (its compilation)
  rollout:K   in the K-th rollout round, after sampling, before scoring
  update:K    after the K-th train_step, before its metrics are written
  save:K      right after the K-th checkpoint save started (async write in flight)
  delete      at the first file orbax deletes of an old checkpoint (half-deleted)
  export      during the final Hugging Face export
  random:S    S seconds after start
  eval:K      at the K-th eval (the one before training is the 1st of a fresh run)
  queue:K     after the K-th train_step of an asynchronous run, once the last checkpoint is
              committed and the sampler has filled the queue as far as rollout.max_staleness
              lets it
  pause:K     before step K's rollout (after waiting for pending saves): writes
              <run_dir>/PAUSED, waits for <run_dir>/GO, then goes on
  none        runs normally

``term:POINT`` sends SIGTERM to itself at POINT instead (a preemption) and goes on, writing
``SIGNALLED <point> <unix time>``; ``int:POINT`` sends SIGINT to its whole process group, as
Ctrl-C in a terminal does (launch it in a session of its own).
"""
import dataclasses
import os
import signal
import sys
import threading
import time


SIGNAL = [signal.SIGKILL]  # what die() sends


def die(point: str) -> None:
  if SIGNAL[0] == signal.SIGKILL:
    os.write(2, f"\nKILLED {point}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)
  os.write(2, f"\nSIGNALLED {point} {time.time()}\n".encode())
  if SIGNAL[0] == signal.SIGINT:
    os.killpg(0, signal.SIGINT)
  else:
    os.kill(os.getpid(), SIGNAL[0])


def after(seconds: float, point: str) -> None:
  threading.Timer(seconds, die, (point,)).start()


def nth_call(owner, name: str, k: int, action, point: str) -> None:
  """Wrap ``owner.name`` so that its k-th call runs ``action(original, args, kwargs)``."""
  original = getattr(owner, name)
  count = [0]

  def wrapper(*args, **kwargs):
    count[0] += 1
    if count[0] == k:
      return action(original, args, kwargs)
    return original(*args, **kwargs)
  setattr(owner, name, wrapper)


def install(point: str, run_dir: str) -> None:
  mode, _, rest = point.partition(":")
  if mode in ("term", "int"):
    SIGNAL[0] = signal.SIGTERM if mode == "term" else signal.SIGINT
    point = rest
  if mode == "int":
    # As in a terminal's foreground job. A suite started in the background of a non-interactive
    # shell (`pytest ... &`) hands its children SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler: Ctrl-C would do nothing and the test would fail for that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
  kind, _, arg = point.partition(":")
  from rljax import models
  from rljax.runs import checkpoint
  from rljax.train import evaluation, generation, loop, sft

  def die_before(original, args, kwargs):
    die(point)
    return original(*args, **kwargs)  # reached only when die() only signalled

  def die_after(original, args, kwargs):
    result = original(*args, **kwargs)
    die(point)
    return result

  if kind == "sft":
    nth_call(sft, "make_batch", int(arg), die_before, point)
  elif kind == "rm":
    from rljax.data import preferences
    nth_call(preferences, "batch_indices", int(arg), die_before, point)
  elif kind == "compile":
    def timed(original, args, kwargs):
      after(float(arg), point)
      return original(*args, **kwargs)
    nth_call(loop, "to_device", 1, timed, point)
  elif kind == "rollout":
    def sample_then_die(original, args, kwargs):
      real = args[0].reward

      def reward(batch):
        die(point)
        return real(batch)
      generator = dataclasses.replace(args[0], reward=reward)
      return original(generator, *args[1:], **kwargs)
    nth_call(generation, "generate", int(arg), sample_then_die, point)
  elif kind == "eval":
    nth_call(evaluation, "evaluate", int(arg), die_before, point)
  elif kind == "update":
    nth_call(loop, "summarize", int(arg), die_before, point)
  elif kind == "queue":
    from rljax.train import actors
    samplers = []
    real_init = actors.AsyncSampler.__init__

    def init(self, *args, **kwargs):
      samplers.append(self)
      real_init(self, *args, **kwargs)
    actors.AsyncSampler.__init__ = init

    def die_when_full(original, args, kwargs):
      result = original(*args, **kwargs)
      args[0].run.checkpointer.wait()  # the last checkpoint committed: the queue is the subject
      while samplers[-1].queued() < samplers[-1].max_staleness:
        time.sleep(0.01)
      die(point)
      return result
    nth_call(loop.RunLearner, "learn", int(arg), die_when_full, point)
  elif kind == "save":
    nth_call(checkpoint.Checkpointer, "save", int(arg), die_after, point)
  elif kind == "delete":
    root = os.path.realpath(os.path.join(run_dir, "checkpoints"))
    real_unlink = os.unlink

    def unlink(path, *, dir_fd=None):
      where = path if dir_fd is None else os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"),
                                                      path)
      if os.path.realpath(os.fspath(where)).startswith(root + os.sep):
        real_unlink(path, dir_fd=dir_fd)  # one file gone: the checkpoint is half-deleted
        die(point)
      return real_unlink(path, dir_fd=dir_fd)
    os.unlink = unlink
    os.remove = unlink
  elif kind == "export":
    real_save_hf = models.save_hf

    def save_hf(path, *args, **kwargs):
      if os.path.basename(os.path.normpath(path)) == "hf":  # the run's export, not the SFT's
        after(0.05, point)
        real_save_hf(path, *args, **kwargs)
        die(point)
      return real_save_hf(path, *args, **kwargs)
    models.save_hf = save_hf
  elif kind == "random":
    after(float(arg), point)
  elif kind == "pause":
    step = int(arg)
    real_collect = loop.collect_batch

    def collect(run, step_index, stream=0, **kwargs):
      if step_index == step and stream == 0:
        run.checkpointer.wait()
        open(os.path.join(run_dir, "PAUSED"), "w").close()
        while not os.path.exists(os.path.join(run_dir, "GO")):
          time.sleep(0.05)
      return real_collect(run, step_index, stream, **kwargs)
    loop.collect_batch = collect
  elif kind != "none":
    raise SystemExit(f"unknown kill point {point!r}")


def main():
  point, args = sys.argv[1], sys.argv[2:]
  run_dir = next((a.split("=", 1)[1] for a in args if a.startswith("--config.train.run_dir=")),
                 "")
  install(point, run_dir)
  from tests.train import tiny  # registers the tiny reward
  del tiny
  from rljax import cli
  cli.entry(args)


if __name__ == "__main__":
  main()

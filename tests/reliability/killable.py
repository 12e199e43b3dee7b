"""``python -m tests.reliability.killable POINT rljax-args...``: ``rljax`` that SIGKILLs itself at
POINT (or pauses there), for the fault-injection tests.

Before dying it writes ``KILLED <point>`` to stderr, so the test knows the point was reached.

  sft:K       at the K-th SFT batch
  compile:S   S seconds into the first train-step call (its compilation)
  rollout:K   in the K-th rollout round, after sampling, before scoring
  update:K    after the K-th train_step, before its metrics are written
  save:K      right after the K-th checkpoint save started (async write in flight)
  delete      at the first file orbax deletes of an old checkpoint (half-deleted)
  export      during the final Hugging Face export
  random:S    S seconds after start
  pause:K     before step K's rollout (after waiting for pending saves): writes
              <run_dir>/PAUSED, waits for <run_dir>/GO, then goes on
  none        runs normally
"""
import dataclasses
import os
import signal
import sys
import threading
import time


def die(point: str) -> None:
  os.write(2, f"\nKILLED {point}\n".encode())
  os.kill(os.getpid(), signal.SIGKILL)


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
  kind, _, arg = point.partition(":")
  from rljax import models
  from rljax.train import checkpoint, generation, loop, sft

  def die_before(original, args, kwargs):
    die(point)

  def die_after(original, args, kwargs):
    original(*args, **kwargs)
    die(point)

  if kind == "sft":
    nth_call(sft, "make_batch", int(arg), die_before, point)
  elif kind == "compile":
    def timed(original, args, kwargs):
      after(float(arg), point)
      return original(*args, **kwargs)
    nth_call(loop, "to_device", 1, timed, point)
  elif kind == "rollout":
    def sample_then_die(original, args, kwargs):
      generator = dataclasses.replace(args[0], verifier=lambda completions, problems: die(point))
      return original(generator, *args[1:], **kwargs)
    nth_call(generation, "generate", int(arg), sample_then_die, point)
  elif kind == "update":
    nth_call(loop, "summarize", int(arg), die_before, point)
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

    def collect(run, step_index, stream=0):
      if step_index == step and stream == 0:
        run.checkpointer.wait()
        open(os.path.join(run_dir, "PAUSED"), "w").close()
        while not os.path.exists(os.path.join(run_dir, "GO")):
          time.sleep(0.05)
      return real_collect(run, step_index, stream)
    loop.collect_batch = collect
  elif kind != "none":
    raise SystemExit(f"unknown kill point {point!r}")


def main():
  point, args = sys.argv[1], sys.argv[2:]
  run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--config.train.run_dir="))
  install(point, run_dir)
  from tests.train import tiny  # registers the tiny reward
  del tiny
  from rljax import cli
  cli.entry(args)


if __name__ == "__main__":
  main()

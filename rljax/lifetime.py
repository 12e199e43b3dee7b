"""A command started by another rljax command ends with it, kill -9 of the parent included.

``rljax sweep`` starts every run as an ``rljax train`` (or ``sft``) subprocess and names itself
in the child's environment (``PARENT_ENV``). The child's entry point calls ``die_with_parent``:
Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) then sends the child SIGTERM when the
sweep dies however it dies, and the run stops as a preempted run does (a checkpoint at the last
step boundary, its run-dir lock released), taking its verifier workers with it
(``rljax.rewards.isolation``: they die with their trainer). Without it a killed sweep left its
runs training, and the rerun was refused on their locks.

The signal is armed against the thread that started the child (Linux's rule): the sweep starts
children from its main thread or from pool threads that live until every child has ended.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "RLJAX_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def child_env(env: dict) -> dict:
  """``env`` for a child that must end with this process (``die_with_parent`` in the child)."""
  return dict(env, **{PARENT_ENV: str(os.getpid())})


def die_with_parent(sig: int = signal.SIGTERM) -> None:
  """When ``PARENT_ENV`` names this process's parent: receive ``sig`` when the parent dies, and
  exit now if it is already gone. The variable is removed, so this process's own children are
  not tied to their grandparent. Elsewhere than on Linux nothing is armed."""
  expected = os.environ.pop(PARENT_ENV, None)
  if not expected or not sys.platform.startswith("linux"):
    return
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
  if os.getppid() != int(expected):  # the parent died before the signal was armed
    raise SystemExit(f"error: the process that started this one (pid {expected}) is gone; "
                     "not starting")

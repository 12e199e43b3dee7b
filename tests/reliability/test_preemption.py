"""The SIGTERM guard on its own (no JAX): which work a preemption abandons, which it lets finish,
and what happens when the save outlives train.preempt_grace_s. The whole-run behaviour (exit
code, the line, resume) is tested by test_kill_resume.py's SIGTERM chain."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rljax.runs import preemption
from tests.train import tiny


def _sigterm_self():
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.05)  # the handler runs in this (the main) thread at the next bytecode


def test_droppable_work_is_abandoned_at_once():
  previous = signal.getsignal(signal.SIGTERM)
  with preemption.guard("RUN", grace_s=60) as guard:
    guard.at_step(2, {"data": 1})
    reached_the_end = False
    with pytest.raises(preemption.Preempted):
      with guard.droppable():
        _sigterm_self()
        reached_the_end = True
    assert not reached_the_end and (guard.step, guard.extra) == (2, {"data": 1})
  assert signal.getsignal(signal.SIGTERM) == previous  # the trainer's handler is gone again


def test_other_work_finishes_and_the_run_stops_at_the_next_step():
  with preemption.guard("RUN", grace_s=60) as guard:
    guard.at_step(2, {"data": 1})
    _sigterm_self()  # e.g. during the donated train_step: noted only, this line goes on
    assert guard.requested == "SIGTERM"
    with pytest.raises(preemption.Preempted):
      guard.at_step(3, {"data": 2})
    assert (guard.step, guard.extra) == (3, {"data": 2})  # what the save will write
    with pytest.raises(preemption.Preempted):  # nothing droppable starts after the request
      with guard.droppable():
        pass


def test_a_save_that_outlives_the_grace_period_is_reported_in_one_line(tmp_path):
  script = textwrap.dedent("""
      import os, signal, time
      from rljax.runs import preemption
      with preemption.guard("RUN", grace_s=0.5) as guard:
        guard.at_step(3, {})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # a checkpoint save that does not finish
      """)
  start = time.monotonic()
  result = subprocess.run([sys.executable, "-c", script], cwd=tiny.ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=tiny.ROOT))
  assert time.monotonic() - start < 30  # it left at the deadline (measured ~0.6 s), not at 60 s
  assert result.returncode == 1
  assert result.stderr == (
      "preempted (SIGTERM) at step 3: the checkpoint was not saved within "
      "train.preempt_grace_s=0.5 s; resume with --config.train.resume=True restarts from the "
      "last complete checkpoint in RUN/checkpoints\n")

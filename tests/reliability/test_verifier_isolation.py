"""Verifiers run in killable processes: hangs and GIL-holding work are bounded by reward.timeout_s,
every failure is counted by kind, bad return values are never rounded, a sample is logged."""
import json
import threading
import time

import numpy as np
import pytest

from rljax.data import Problem
from rljax.rewards import isolation, verifiers

LOOP_FOREVER = "test_reliability_loop_forever"
REAL_VALUED = "test_reliability_real_valued"

if LOOP_FOREVER not in verifiers.REWARD_FNS:
  # Registered in a test module after rljax was imported: the forked workers must still see it.
  @verifiers.register_reward(LOOP_FOREVER)
  def _loop_forever(completion, problem):
    if completion == "hang":
      while True:
        pass
    return float(completion == problem.answer)

  @verifiers.register_reward(REAL_VALUED, binary=False, value_range=(-1.0, 2.0))
  def _real_valued(completion, problem):
    return {"half": 0.5, "top": 2.0, "nan": float("nan"), "big": 3.0, "none": None,
            "text": "yes"}[completion]


def _ticks_during(fn):
  """(result of fn(), ticks a Python thread of the trainer made meanwhile): the trainer's
  interpreter stays responsive only if the verifier does not hold its GIL."""
  ticks, stop = [0], threading.Event()

  def tick():
    while not stop.is_set():
      ticks[0] += 1
      time.sleep(0.01)
  thread = threading.Thread(target=tick)
  thread.start()
  try:
    result = fn()
  finally:
    stop.set()
    thread.join()
  return result, ticks[0]


def test_infinite_loop_is_bounded_counted_and_its_worker_replaced():
  problems = [Problem("q", "a")] * 4
  start = time.monotonic()
  scores, ticks = _ticks_during(lambda: verifiers.score_completions(
      LOOP_FOREVER, ["hang", "a", "hang", "b"], problems, wrong_value=-1.0, timeout_s=0.5,
      workers=2))
  elapsed = time.monotonic() - start
  assert elapsed < 3.0, elapsed
  assert ticks > 10  # the trainer kept running Python while the verifier spun
  assert scores.rewards.tolist() == [-1.0, 1.0, -1.0, -1.0]
  assert scores.metrics() == {"reward/timeouts": 2.0, "reward/errors": 0.0,
                              "reward/invalid": 0.0}
  pool = isolation.shared_pool(verifiers._Judge(verifiers.get_reward_fn(LOOP_FOREVER)), 2)
  assert pool.replaced >= 2 and all(w.process.is_alive() for w in pool._workers)
  # The replaced workers serve the next batch.
  again = verifiers.score_completions(LOOP_FOREVER, ["a", "b"], problems[:2], timeout_s=2.0,
                                      workers=2)
  assert again.rewards.tolist() == [1.0, 0.0] and again.num_timeouts == 0


@pytest.mark.parametrize("answer", [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{10^{10^{8}}}"])
def test_gil_holding_math_verify_is_bounded(answer):
  pytest.importorskip("math_verify")
  problems = [Problem("What is 2+2?", "4")] * 2
  start = time.monotonic()
  scores, ticks = _ticks_during(lambda: verifiers.score_completions(
      "math_verify", [answer, r"\boxed{4}"], problems, timeout_s=1.0, workers=2))
  elapsed = time.monotonic() - start
  assert elapsed < 4.0, elapsed
  assert ticks > 10
  assert scores.correct.tolist() == [False, True]
  assert scores.metrics() == {"reward/timeouts": 1.0, "reward/errors": 0.0,
                              "reward/invalid": 0.0}
  assert scores.failures[0]["completion"] == answer


def test_invalid_values_are_counted_not_rounded(tmp_path):
  completions = ["half", "top", "nan", "big", "none", "text"]
  log = verifiers.FailureLog(str(tmp_path / "failures.jsonl"), limit=3)
  scores = verifiers.score_completions(REAL_VALUED, completions, [Problem("q", "")] * 6,
                                       wrong_value=-1.0, timeout_s=5.0, workers=2,
                                       failure_log=log)
  np.testing.assert_allclose(scores.rewards, [0.5, 2.0, -1.0, -1.0, -1.0, -1.0])
  assert scores.correct.tolist() == [False, True, False, False, False, False]
  assert (scores.num_timeouts, scores.num_errors, scores.num_invalid) == (0, 0, 4)
  lines = [json.loads(l) for l in open(tmp_path / "failures.jsonl")]
  assert len(lines) == 3  # bounded
  assert [l["completion"] for l in lines] == ["nan", "big", "none"]
  assert "outside its declared range [-1.0, 2.0]" in lines[1]["detail"]
  # The bound holds across batches (and across a resumed run reopening the file).
  verifiers.score_completions(REAL_VALUED, ["nan"], [Problem("q", "")], timeout_s=5.0,
                              failure_log=verifiers.FailureLog(log.path, limit=3))
  assert len(open(tmp_path / "failures.jsonl").readlines()) == 3


def test_binary_verifier_returning_a_fraction_is_invalid():
  def fraction(completion, problem):
    if completion == "err":
      return 1 / 0
    return {"yes": 1, "no": False, "partial": 0.3}[completion]

  scores = verifiers.score_completions(fraction, ["yes", "no", "partial", "err"],
                                       [Problem("q", "")] * 4, timeout_s=5.0, workers=2)
  assert scores.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
  assert scores.correct.tolist() == [True, False, False, False]
  assert (scores.num_invalid, scores.num_errors) == (1, 1)
  details = {f["completion"]: f["detail"] for f in scores.failures}
  assert "0.3 but is declared binary" in details["partial"]
  assert "ZeroDivisionError" in details["err"]
  assert verifiers.sum_metrics([scores, scores]) == {
      "reward/timeouts": 0.0, "reward/errors": 2.0, "reward/invalid": 2.0}


def test_worker_that_dies_is_an_error_and_replaced():
  import os

  def die(completion, problem):
    if completion == "die":
      os._exit(3)
    return 1.0

  scores = verifiers.score_completions(die, ["die", "ok", "ok"], [Problem("q", "")] * 3,
                                       timeout_s=5.0, workers=1)
  assert scores.rewards.tolist() == [0.0, 1.0, 1.0]
  assert scores.num_errors == 1 and scores.failures[0]["detail"] == "verifier process died"


def test_register_reward_checks_its_declaration():
  with pytest.raises(ValueError, match="binary=False"):
    verifiers.register_reward("test_bad_decl", value_range=(0, 2))
  with pytest.raises(ValueError, match="low < high"):
    verifiers.register_reward("test_bad_decl", binary=False, value_range=(1, 1))


def test_worker_killed_between_batches_is_replaced():
  import os
  import signal

  def one(completion, problem):
    return 1.0

  verifiers.score_completions(one, ["a"], [Problem("q", "")], timeout_s=5.0, workers=1)
  pool = isolation.shared_pool(verifiers._Judge(one), 1)
  victim = pool._workers[0].process
  os.kill(victim.pid, signal.SIGKILL)
  victim.join(5)
  scores = verifiers.score_completions(one, ["a", "b"], [Problem("q", "")] * 2, timeout_s=5.0,
                                       workers=1)
  # Either the dead pipe is noticed on send (retried in a fresh worker) or on receive (an error).
  assert scores.num_errors + int(scores.rewards.sum()) == 2 and scores.num_errors <= 1
  assert pool._workers[0].process.is_alive() and pool._workers[0].process.pid != victim.pid

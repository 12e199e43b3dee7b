"""Verifiers run in killable processes: hangs and GIL-holding work are bounded by reward.timeout_s,
every failure is counted by kind, bad return values are never rounded, a sample is logged, and no
behaviour of a verifier (forks, exits, signals, children, memory) outlives its call."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from rljax.data import Problem
from rljax.rewards import isolation, checkers

LOOP_FOREVER = "test_reliability_loop_forever"
REAL_VALUED = "test_reliability_real_valued"

if LOOP_FOREVER not in checkers.REWARD_FNS:
  # Registered in a test module after rljax was imported: the forked workers must still see it.
  @checkers.register_reward(LOOP_FOREVER)
  def _loop_forever(completion, problem):
    if completion == "hang":
      while True:
        pass
    return float(completion == problem.answer)

  @checkers.register_reward(REAL_VALUED, binary=False, value_range=(-1.0, 2.0))
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


def _descendants(pid: int) -> set[int]:
  """Every live process below ``pid``, by parent links read from /proc (independent of
  rljax.rewards.isolation's own process table); zombies count: they are unreaped children."""
  parents = {}
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat", "rb") as f:
          parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
      except (OSError, IndexError):
        pass
  found, frontier = set(), [pid]
  while frontier:
    parent = frontier.pop()
    children = [p for p, pp in parents.items() if pp == parent and p not in found]
    found.update(children)
    frontier.extend(children)
  return found


def _assert_only_the_pools_workers_remain():
  """While the pool is live, only its workers; once it is closed, nothing at all."""
  pool = isolation.current_pool()
  workers = {w.process.pid for w in pool._workers} if pool else set()
  assert _descendants(os.getpid()) == workers
  isolation.close_shared_pool()
  deadline = time.monotonic() + 10
  while _descendants(os.getpid()) and time.monotonic() < deadline:
    time.sleep(0.05)  # killed processes may take a moment to be reaped by init
  assert _descendants(os.getpid()) == set()


def test_infinite_loop_is_bounded_counted_and_its_worker_replaced():
  problems = [Problem("q", "a")] * 4
  start = time.monotonic()
  scores, ticks = _ticks_during(lambda: checkers.score_completions(
      LOOP_FOREVER, ["hang", "a", "hang", "b"], problems, wrong_value=-1.0, timeout_s=0.5,
      workers=2))
  # Events, not wall-clock: each hang was cut off (counted) and its worker killed and replaced.
  # The bound only proves the loop was cut at all (measured: ~1 s; 30 s leaves room for load).
  assert time.monotonic() - start < 30.0
  assert ticks > 10  # the trainer kept running Python while the verifier spun
  assert scores.rewards.tolist() == [-1.0, 1.0, -1.0, -1.0]
  assert scores.metrics() == {"reward/timeouts": 2.0, "reward/errors": 0.0,
                              "reward/invalid": 0.0}
  pool = isolation.current_pool()
  assert pool.replaced == 2 and all(w.process.is_alive() for w in pool._workers)
  # The replaced workers serve the next batch.
  again = checkers.score_completions(LOOP_FOREVER, ["a", "b"], problems[:2], timeout_s=5.0,
                                      workers=2)
  assert again.rewards.tolist() == [1.0, 0.0] and again.num_timeouts == 0
  assert isolation.current_pool() is pool and pool.replaced == 2
  _assert_only_the_pools_workers_remain()


@pytest.mark.parametrize("answer", [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{10^{10^{8}}}"])
def test_gil_holding_math_verify_is_bounded(answer):
  pytest.importorskip("math_verify")
  problems = [Problem("What is 2+2?", "4")] * 2
  start = time.monotonic()
  scores, ticks = _ticks_during(lambda: checkers.score_completions(
      "math_verify", [answer, r"\boxed{4}"], problems, timeout_s=1.0, workers=2))
  assert time.monotonic() - start < 30.0  # cut off at all (measured ~1.5 s); counted below
  assert ticks > 10
  assert scores.correct.tolist() == [False, True]
  assert scores.metrics() == {"reward/timeouts": 1.0, "reward/errors": 0.0,
                              "reward/invalid": 0.0}
  assert scores.failures[0]["completion"] == answer


def test_invalid_values_are_counted_not_rounded(tmp_path):
  completions = ["half", "top", "nan", "big", "none", "text"]
  log = checkers.FailureLog(str(tmp_path / "failures.jsonl"), limit=3)
  scores = checkers.score_completions(REAL_VALUED, completions, [Problem("q", "")] * 6,
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
  checkers.score_completions(REAL_VALUED, ["nan"], [Problem("q", "")], timeout_s=5.0,
                              failure_log=checkers.FailureLog(log.path, limit=3))
  assert len(open(tmp_path / "failures.jsonl").readlines()) == 3


def test_binary_verifier_returning_a_fraction_is_invalid():
  def fraction(completion, problem):
    if completion == "err":
      return 1 / 0
    return {"yes": 1, "no": False, "partial": 0.3}[completion]

  scores = checkers.score_completions(fraction, ["yes", "no", "partial", "err"],
                                       [Problem("q", "")] * 4, timeout_s=5.0, workers=2)
  assert scores.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
  assert scores.correct.tolist() == [True, False, False, False]
  assert (scores.num_invalid, scores.num_errors) == (1, 1)
  details = {f["completion"]: f["detail"] for f in scores.failures}
  assert "0.3 but is declared binary" in details["partial"]
  assert "ZeroDivisionError" in details["err"]
  assert checkers.sum_metrics([scores, scores]) == {
      "reward/timeouts": 0.0, "reward/errors": 2.0, "reward/invalid": 2.0}


def test_workers_0_scores_in_this_process_as_the_workers_do(tmp_path):
  """reward.workers=0: the same rewards, flags, counts and failure details as a pool, with no
  process started (a verifier that records its pid shows where it ran)."""
  pids = tmp_path / "pids"

  def fraction(completion, problem):
    with open(pids, "a") as f:
      f.write(f"{os.getpid()}\n")
    if completion == "err":
      return 1 / 0
    return {"yes": 1, "no": False, "partial": 0.3}[completion]

  calls = (["yes", "no", "partial", "err"], [Problem("q", "")] * 4)
  _assert_only_the_pools_workers_remain()  # closes the pool: no process below this one
  pool = isolation.current_pool()
  here = checkers.score_completions(fraction, *calls, timeout_s=5.0, workers=0)
  assert set(pids.read_text().split()) == {str(os.getpid())}
  assert isolation.current_pool() is pool and _descendants(os.getpid()) == set()
  pooled = checkers.score_completions(fraction, *calls, timeout_s=5.0, workers=2)
  assert str(os.getpid()) not in pids.read_text().split()[4:]
  assert here.rewards.tolist() == pooled.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
  assert here.correct.tolist() == pooled.correct.tolist() == [True, False, False, False]
  assert (here.num_invalid, here.num_errors, here.num_timeouts) == (1, 1, 0)
  assert here.failures == pooled.failures
  isolation.close_shared_pool()


def test_workers_0_is_refused_with_an_environment_and_leaves_the_timeout_unread():
  from rljax.config import checks as config_checks
  from rljax.config.loader import load_config_file
  from rljax.errors import ConfigError, UnusedKeyError
  configs = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
  main = load_config_file(os.path.join(configs, "jobs", "main.py"))
  assert main.reward.workers == 0
  config_checks.check_config(main)
  env = load_config_file(os.path.join(configs, "tasks", "tool_calc.py"))
  env.reward.workers = 0
  with pytest.raises(ConfigError, match="reward.workers=0 with env.name='tool_calc'"):
    config_checks.check_config(env)
  main.reward.timeout_s = 2.0
  with pytest.raises(UnusedKeyError, match="reward.timeout_s=2.0 is not used: reward.workers=0"):
    config_checks.check_config(main)


def test_worker_that_dies_is_an_error_and_replaced():
  import os

  def die(completion, problem):
    if completion == "die":
      os._exit(3)
    return 1.0

  scores = checkers.score_completions(die, ["die", "ok", "ok"], [Problem("q", "")] * 3,
                                       timeout_s=5.0, workers=1)
  assert scores.rewards.tolist() == [0.0, 1.0, 1.0]
  assert scores.num_errors == 1 and scores.failures[0]["detail"] == "verifier process died"


def test_register_reward_checks_its_declaration():
  with pytest.raises(ValueError, match="binary=False"):
    checkers.register_reward("test_bad_decl", value_range=(0, 2))
  with pytest.raises(ValueError, match="low < high"):
    checkers.register_reward("test_bad_decl", binary=False, value_range=(1, 1))


def test_worker_killed_between_batches_is_replaced():
  import os
  import signal

  def one(completion, problem):
    return 1.0

  checkers.score_completions(one, ["a"], [Problem("q", "")], timeout_s=5.0, workers=1)
  pool = isolation.current_pool()
  victim = pool._workers[0].process
  os.kill(victim.pid, signal.SIGKILL)
  victim.join(5)
  scores = checkers.score_completions(one, ["a", "b"], [Problem("q", "")] * 2, timeout_s=5.0,
                                       workers=1)
  # Either the dead pipe is noticed on send (retried in a fresh worker) or on receive (an error).
  assert scores.num_errors + int(scores.rewards.sum()) == 2 and scores.num_errors <= 1
  assert pool._workers[0].process.is_alive() and pool._workers[0].process.pid != victim.pid


def _nap(seconds):
  time.sleep(seconds)
  return time.monotonic()


def test_queued_calls_start_as_workers_free_up_without_a_poll():
  """Asynchronous calls (the multi-turn engine's tool steps): a worker that answers takes the
  next queued call at once, not at the caller's next ``poll``, and so does the fresh worker
  that replaces one killed at its deadline. One worker, nobody polling for 2 s (over 3x the
  calls' 0.6 s of sleep): all three calls answered, each ending ~0.2 s after the one before;
  then a hung call times out and the call queued behind it still runs before the next poll."""
  pool = isolation.VerifierPool(_nap, workers=1)
  try:
    for tag in range(3):
      pool.submit(tag, (0.2,), timeout_s=30.0)
    time.sleep(2.0)
    polled = time.monotonic()
    got = pool.poll(0.0)
    assert [tag for tag, _ in got] == [0, 1, 2] and pool.in_flight == 0
    ends = [outcome.value for _, outcome in got]
    assert all(b - a >= 0.2 for a, b in zip(ends, ends[1:])) and ends[-1] < polled
    pool.submit("hang", (60.0,), timeout_s=0.5)
    pool.submit("after", (0.0,), timeout_s=30.0)
    time.sleep(3.0)
    polled = time.monotonic()
    got = dict(pool.poll(0.0))
    assert got["hang"].status == "timeout" and pool.replaced == 1
    assert got["after"].status == "ok" and got["after"].value < polled
    assert pool.poll(0.5) == [] and pool.in_flight == 0
  finally:
    pool.close()


# --- any behaviour of a verifier costs one answer, never the run, and leaves no process ------------

class _Unprintable:
  def __repr__(self):
    raise RuntimeError("no repr")

  def __reduce__(self):
    raise RuntimeError("no pickling")


class _OddFloat(float):
  """A float the trainer could not unpickle: only its value may cross the pipe."""

  def __reduce__(self):
    raise RuntimeError("no pickling")


def _score(verifier, completions, **kwargs):
  kwargs.setdefault("timeout_s", 5.0)
  kwargs.setdefault("workers", 1)
  return checkers.score_completions(verifier, completions, [Problem("q", "")] * len(completions),
                                     wrong_value=-1.0, **kwargs)


def _details(scores):
  return {f["completion"]: f["detail"] for f in scores.failures}


def test_strange_return_values_are_invalid():
  values = {"huge": 10**400, "-huge": -10**400, "inf": float("inf"), "nan": float("nan"),
            "array": np.ones(1), "object": _Unprintable(), "odd": _OddFloat(1.0), "ok": 1.0}
  scores = _score(lambda completion, problem: values[completion], list(values))
  assert scores.rewards.tolist() == [-1.0] * 6 + [1.0, 1.0]
  assert (scores.num_invalid, scores.num_errors, scores.num_timeouts) == (6, 0, 0)
  details = _details(scores)
  assert details["huge"] == "returned int that no float can hold (OverflowError)"
  assert details["inf"] == "returned inf" and details["array"].startswith("returned ndarray")
  assert details["object"] == "returned _Unprintable <unprintable>, not a number"
  _assert_only_the_pools_workers_remain()


def test_forks_exits_and_base_exceptions_are_errors():
  class Custom(BaseException):
    pass

  def misbehave(completion, problem):
    if completion == "fork":
      os.fork()  # both copies return: only the worker may answer
    elif completion == "fork-and-loop" and os.fork() == 0:
      while True:
        pass
    elif completion in actions:
      actions[completion]()
    return 1.0

  def raise_(error):
    def go():
      raise error
    return go
  actions = {"os._exit": lambda: os._exit(3), "sys.exit": lambda: sys.exit(0),
             "KeyboardInterrupt": raise_(KeyboardInterrupt()), "custom": raise_(Custom("x"))}
  completions = ["fork", "fork-and-loop", *actions, "ok"]
  scores = _score(misbehave, completions)
  assert scores.rewards.tolist() == [-1.0] * 6 + [1.0]
  assert (scores.num_errors, scores.num_timeouts, scores.num_invalid) == (6, 0, 0)
  details = _details(scores)
  assert details["fork"] == details["fork-and-loop"] == (
      "the verifier left 1 process(es) running (killed)")
  assert details["os._exit"] == "verifier process died"
  assert details["sys.exit"] == "SystemExit: 0" and details["custom"] == "Custom: x"
  assert details["KeyboardInterrupt"] == "KeyboardInterrupt"
  _assert_only_the_pools_workers_remain()


def test_signals_a_verifier_sends_itself():
  def signal_self(completion, problem):
    if completion == "SIGTERM":
      os.kill(os.getpid(), signal.SIGTERM)
    elif completion == "SIGINT":  # ignored: Ctrl-C belongs to the trainer
      os.kill(os.getpid(), signal.SIGINT)
    elif completion == "SIGSTOP":
      os.kill(os.getpid(), signal.SIGSTOP)
    elif completion == "killpg":  # before process groups, this killed the trainer
      os.killpg(0, signal.SIGKILL)
    time.sleep(0.1)  # let a signal land before the answer
    return 1.0

  scores = _score(signal_self, ["SIGTERM", "SIGINT", "SIGSTOP", "killpg", "ok"], timeout_s=2.0)
  assert scores.rewards.tolist() == [-1.0, 1.0, -1.0, -1.0, 1.0]
  assert (scores.num_errors, scores.num_timeouts) == (2, 1)
  assert isolation.current_pool().replaced == 3
  _assert_only_the_pools_workers_remain()


def test_children_a_verifier_starts_never_outlive_its_call():
  forever = [sys.executable, "-c", "import time; time.sleep(1000)"]

  def start_children(completion, problem):
    if completion == "left running":
      subprocess.Popen(forever)
    elif completion == "own session, then hang":  # escapes the process group, not the tree
      subprocess.Popen(forever, start_new_session=True)
      time.sleep(1000)
    elif completion == "double fork" and os.fork() == 0:  # the grandchild is orphaned
      subprocess.Popen(forever, start_new_session=True)
      os._exit(0)
    elif completion == "waited for":
      subprocess.run([sys.executable, "-c", "pass"], check=True)
    return 1.0

  completions = ["left running", "own session, then hang", "double fork", "waited for", "ok"]
  scores = _score(start_children, completions, timeout_s=3.0)
  assert scores.rewards.tolist() == [-1.0, -1.0, -1.0, 1.0, 1.0]
  assert (scores.num_errors, scores.num_timeouts) == (2, 1)
  # The forked child exits at once: whether it is still there when the worker counts is a race
  # (2 with it, 1 without); its orphaned grandchild is always found and killed.
  assert re.fullmatch(r"the verifier left [12] process\(es\) running \(killed\)",
                      _details(scores)["double fork"])
  _assert_only_the_pools_workers_remain()


def test_memory_is_bounded_and_workers_recycled(tmp_path):
  kept, pids = [], str(tmp_path / "pids")

  def keep_memory(completion, problem):
    kept.append(bytearray(50 * 2**20))  # 50 MB per call that the worker never frees
    with open(pids, "a") as f:
      f.write(f"{os.getpid()}\n")
    return 1.0

  scores = _score(keep_memory, ["x"] * 12, max_worker_memory_mb=175)
  # A fresh worker holds 3 x 50 MB under 175 MB; memory the trainer had allocated but the worker
  # frees (garbage collected after the fork) adds a little room, hence up to 5 calls, not 3.
  # Each failed call's worker is replaced by an empty one, which serves the next call.
  failed = [i for i, r in enumerate(scores.rewards) if r == -1.0]
  runs = np.diff([-1] + failed) - 1  # calls served by each worker before its MemoryError
  assert len(failed) >= 2 and all(3 <= n <= 5 for n in runs), failed
  assert all(f["detail"].startswith("MemoryError") for f in scores.failures)
  assert isolation.current_pool().recycled == len(failed)
  _assert_only_the_pools_workers_remain()

  open(pids, "w").close()
  scores = _score(keep_memory, ["x"] * 6, worker_max_calls=2)
  assert scores.num_errors == 0
  served = open(pids).read().split()
  assert [served.count(p) for p in dict.fromkeys(served)] == [2, 2, 2]  # three workers, in turn
  _assert_only_the_pools_workers_remain()

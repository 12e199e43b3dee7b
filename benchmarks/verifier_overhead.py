"""Verifier overhead on the main job's load: process-pool verifiers (rljax.rewards.isolation)
against the thread pool they replaced and against calls in the trainer's process
(``reward.workers=0``, the main job's setting), in one process.

The former main job (configs/jobs/main_600.py) scores P x G = 16 x 8 = 128 completions per step with
``exact_match`` on embedded arithmetic (600 steps), plus 13 greedy evals of 256 problems. This
replays that load: the completions are a mix of reference solutions, wrong answers and garbage,
and the trainer process holds the JAX runtime and a ~100 MB array so that forking is realistic.
Prints seconds per 128-call batch of each and the overhead as a fraction of the main job's
measured RL wall time per step (docs/results/main_job/README.md: 308 s for 600 steps, 5-seed mean; a
step scores 2.3-3.5 such batches under dynamic sampling).

  PYTHONPATH=. python benchmarks/verifier_overhead.py [--steps 600]
"""
import argparse
import dataclasses
import queue
import threading
import time
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from rljax.data import make_task
from rljax.rewards import checkers

MAIN_JOB_WALL_S, MAIN_JOB_STEPS = 308.0, 600
ROWS, EVAL_ROWS, EVALS = 128, 256, 13


@dataclasses.dataclass(frozen=True)
class Outcome:
  status: str
  value: object = None


def run_with_timeouts(calls: Sequence[Callable[[], object]], *, timeout_s: float,
                      workers: int) -> list[Outcome]:
  """Run ``calls`` on ``workers`` threads; a call running longer than ``timeout_s`` is abandoned.

  Python cannot kill a thread, so an abandoned call keeps its (daemon) thread and a fresh worker
  takes its place: a hung verifier never blocks the rest of the batch nor interpreter exit.
  """
  n = len(calls)
  outcomes: list[Outcome | None] = [None] * n
  started: list[float | None] = [None] * n
  jobs: queue.SimpleQueue[int] = queue.SimpleQueue()
  for i in range(n):
    jobs.put(i)
  done = threading.Condition()

  def worker():
    while True:
      try:
        i = jobs.get_nowait()
      except queue.Empty:
        return
      with done:
        started[i] = time.monotonic()
      try:
        outcome = Outcome("ok", calls[i]())
      except Exception as e:  # a verifier bug is one wrong answer, not a crashed run
        outcome = Outcome("error", e)
      with done:
        if outcomes[i] is None:  # None unless it was already declared timed out
          outcomes[i] = outcome
          done.notify_all()

  def start_worker():
    threading.Thread(target=worker, daemon=True, name="rljax-verifier").start()

  for _ in range(min(workers, n)):
    start_worker()
  with done:
    while any(o is None for o in outcomes):
      now = time.monotonic()
      running = [i for i in range(n) if outcomes[i] is None and started[i] is not None]
      for i in running:
        if now - started[i] >= timeout_s:
          outcomes[i] = Outcome("timeout")
          start_worker()  # replaces the thread stuck in call i
      deadlines = [started[i] + timeout_s for i in running if outcomes[i] is None]
      done.wait(timeout=max(min(deadlines, default=now + timeout_s) - now, 1e-3))
  return outcomes


def score_with_threads(completions, problems, timeout_s=5.0, workers=4):
  """The previous score_completions: the same judge on daemon threads."""
  fn = checkers.get_reward_fn("exact_match")
  calls = [(lambda c=c, p=p: (fn(c, p) > 0.5, checkers.format_ok(c, p)))
           for c, p in zip(completions, problems)]
  return run_with_timeouts(calls, timeout_s=timeout_s, workers=workers)


def workload(steps: int, seed: int = 0):
  task = make_task("arithmetic", 0)
  rng = np.random.default_rng(seed)
  batches = []
  for step in range(steps):
    problems = [task.problem_at(0, step * 16 + i) for i in range(16) for _ in range(8)]
    completions = []
    for p in problems:
      kind = rng.integers(3)
      completions.append(p.solution if kind == 0 else
                         p.solution.rsplit("#", 1)[0] + "#999" if kind == 1 else "7*8=5#")
    batches.append((completions, problems))
  return batches


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=600)
  args = parser.parse_args()
  ballast = jnp.ones((25_000_000,), jnp.float32).block_until_ready()  # ~100 MB in the trainer
  batches = workload(args.steps)
  evals = workload(2 * EVALS)[:EVALS]  # 256-row evals: two 128-row batches each
  # Warm both paths (the pool forks its workers on first use, once per run).
  score_with_threads(*batches[0])
  t = time.perf_counter()
  checkers.score_completions("exact_match", *batches[0])
  first_call = time.perf_counter() - t
  results = {}
  score = {"threads": score_with_threads,
           "processes": lambda c, p: checkers.score_completions("exact_match", c, p),
           "in_process": lambda c, p: checkers.score_completions("exact_match", c, p,
                                                                  workers=0)}
  for _ in range(2):  # interleaved twice
    for name, fn in score.items():
      t = time.perf_counter()
      for completions, problems in batches + evals + evals:
        out = fn(completions, problems)
      results.setdefault(name, []).append(time.perf_counter() - t)
  del ballast, out
  best = {name: min(times) for name, times in results.items()}
  per_step = MAIN_JOB_WALL_S / MAIN_JOB_STEPS
  print(f"{args.steps} batches x {ROWS} calls + {EVALS} evals x {EVAL_ROWS} calls")
  print(f"pool start-up (fork of 4 workers + first batch): {first_call * 1e3:.1f} ms")
  for name, seconds in best.items():
    print(f"{name:10s} {seconds:.3f} s  ({seconds / args.steps * 1e3:.2f} ms/batch)")
  print(f"processes / threads: {best['processes'] / best['threads']:.2f}")
  for other in ("threads", "in_process"):
    extra = (best["processes"] - best[other]) / args.steps
    print(f"processes - {other}: {extra * 1e3:.2f} ms/batch = {extra / per_step:+.2%} of the "
          f"main job's {per_step * 1e3:.0f} ms/step RL wall time")



if __name__ == "__main__":
  main()

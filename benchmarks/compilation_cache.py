"""What ``train.compilation_cache`` saves when a run starts again: a tiny GRPO run, resumed.

  python benchmarks/compilation_cache.py [--rounds 3]

Each round, once with the cache and once without (``--config.train.compilation_cache=False``),
alternating so that a change in the machine's load slows both alike: a fresh ``rljax train`` of
``configs/algos/grpo.py`` at the tiny size of ``tests/train/tiny.py`` (2 steps, a checkpoint at the
end; its reward function is the preset's, the tests' own is registered only inside the tests),
then a second start of the same run in its own process (``train.resume=True``, 4 steps). Printed,
as medians over the rounds: each process's wall time (Python and the imports included) and its
first step's ``sec_step`` (compilation included), and the cache's entries and size.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.train import tiny  # noqa: E402
from rljax.runs import compilation_cache  # noqa: E402


def train(run_dir: str, extra: dict, after_step: int = 0) -> dict:
  """Wall seconds of one ``rljax train`` process and the ``sec_step`` of its first step, the first
  one after ``after_step`` (the metrics of a resumed run follow those of its first process)."""
  overrides = {k: v for k, v in tiny.OVERRIDES.items() if k != "reward.fn"}
  args = [f"--config.{k}={v}" for k, v in {**overrides, "train.run_dir": run_dir,
                                            **extra}.items()]
  # A cache named by the environment would outrank the run dir's and warm the "off" round.
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", "rljax", "train", "--config",
                  os.path.join(ROOT, "configs", "algos", "grpo.py"), *args], check=True, cwd=ROOT,
                 stdout=subprocess.DEVNULL, env=env)
  wall = time.perf_counter() - start
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    steps = [r for r in map(json.loads, f) if "sec_step" in r and r["step"] > after_step]
  return {"wall": wall, "first_step": steps[0]["sec_step"]}


def cache_size(run_dir: str) -> tuple[int, float]:
  """(entries, MB) of the run's cache."""
  path = os.path.join(run_dir, compilation_cache.DIR_NAME)
  if not os.path.isdir(path):
    return 0, 0.0
  names = os.listdir(path)
  return len(names), sum(os.path.getsize(os.path.join(path, n)) for n in names) / 1e6


def one_round(root: str, cache: bool) -> dict:
  run_dir = os.path.join(root, "on" if cache else "off")
  shutil.rmtree(run_dir, ignore_errors=True)
  flag = {"train.compilation_cache": str(cache)}
  first = train(run_dir, {**flag, "train.steps": "2"})
  second = train(run_dir, {**flag, "train.steps": "4", "train.resume": "True"}, after_step=2)
  entries, mb = cache_size(run_dir)
  return {"first_wall": first["wall"], "first_step": first["first_step"],
          "second_wall": second["wall"], "second_step": second["first_step"],
          "entries": entries, "mb": mb}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  results = {True: [], False: []}
  with tempfile.TemporaryDirectory() as root:
    for i in range(args.rounds):
      for cache in (True, False):
        results[cache].append(one_round(root, cache))
        print(f"# round {i + 1}, cache {'on' if cache else 'off'}: {results[cache][-1]}",
              flush=True)
  keys = ("first_wall", "first_step", "second_wall", "second_step", "entries", "mb")
  print("| train.compilation_cache | first start s | its first step s | second start s | "
        "its first step s | cache entries | cache MB |")
  print("|---|---|---|---|---|---|---|")
  for cache in (True, False):
    med = {k: statistics.median(r[k] for r in results[cache]) for k in keys}
    print(f"| {cache} | " + " | ".join(f"{med[k]:.2f}" if k not in ("entries",) else
                                        f"{med[k]:.0f}" for k in keys) + " |")


if __name__ == "__main__":
  main()

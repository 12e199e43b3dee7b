"""A refactor's speed against an earlier commit: the same benchmarks, same machine, same run.

Runs ``benchmarks/sampler.py`` (rljax side only) and ``benchmarks/train_step.py`` (rljax only) in
this tree and in a git worktree of ``--base`` (made with ``git worktree add --detach`` if
missing), alternating the two trees ``--rounds`` times so that drift in the machine's load hits
both, and prints each figure of each round and the ratio of the medians (this tree / base;
tokens/s above 1 and seconds below 1 mean this tree is faster).

  python benchmarks/against_commit.py --base e8019fb --rounds 3
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLER = ["benchmarks/sampler.py", "--no-hf", "--models", "1M,6M", "--batches", "64",
           "--runs", "5"]
TRAIN = ["benchmarks/train_step.py", "--peers", "", "--steps", "5", "--new-tokens", "128"]


def worktree(base: str) -> str:
  path = os.path.join(os.path.dirname(HERE), f"wt-base-{base[:10]}")
  if not os.path.isdir(path):
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", path, base], check=True,
                   capture_output=True)
  return path


def run(tree: str, args: list[str]) -> str:
  env = dict(os.environ, PYTHONPATH=tree)
  out = subprocess.run([sys.executable] + args, cwd=tree, env=env, capture_output=True,
                       text=True)
  if out.returncode:
    raise SystemExit(f"{' '.join(args)} failed in {tree}:\n{out.stderr[-3000:]}")
  return out.stdout


def sampler_figures(text: str) -> dict:
  """model/batch -> rljax tokens/s, from the table rows ``| model | params | batch | tok/s ...``."""
  out = {}
  for line in text.splitlines():
    m = re.match(r"\|\s*(\w+)\s*\|[^|]*\|\s*(\d+)\s*\|\s*([\d,]+)", line)
    if m:
      out[f"sampler {m.group(1)} batch {m.group(2)} tokens/s"] = float(m.group(3).replace(",", ""))
  return out


def train_figures(text: str) -> dict:
  out = {}
  for line in text.splitlines():
    m = re.match(r"(rollout|scoring|train|update|step)\s+([\d.]+)$", line.strip())
    if m:
      out[f"train {m.group(1)} s"] = float(m.group(2))
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--base", required=True)
  ap.add_argument("--rounds", type=int, default=3)
  args = ap.parse_args()
  trees = {"base": worktree(args.base), "this": HERE}
  figures: dict = {"base": {}, "this": {}}
  for r in range(args.rounds):
    for side, tree in trees.items():
      got = {**sampler_figures(run(tree, SAMPLER)), **train_figures(run(tree, TRAIN))}
      for key, value in got.items():
        figures[side].setdefault(key, []).append(value)
      print(f"round {r + 1} {side}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(got.items())),
            flush=True)
  print(f"\nmedians over {args.rounds} rounds (this tree / base {args.base}):")
  for key in sorted(figures["this"]):
    this, base = (statistics.median(figures[s].get(key, [float("nan")])) for s in ("this", "base"))
    print(f"  {key:<36} base {base:10.4g}  this {this:10.4g}  ratio {this / base:.3f}")


if __name__ == "__main__":
  main()

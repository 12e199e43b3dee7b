"""Samples and length statistics of the embedded tasks, per difficulty, to pick a default.

Lengths are in characters, which are tokens for the char tokenizer. "Answer space" is the number
of distinct answers among the samples (a guess-the-mode baseline is about 1 / that), and
"eval pool" the number of distinct eval prompts found (the cap on data.num_eval).

  python experiments/task_stats.py [--task arithmetic] [--samples 4] [--n 2000]
"""
import argparse
import collections
import random
import statistics

from rljax.data.tasks import TASKS, is_eval_prompt, make_task


def length_summary(lengths: list[int]) -> str:
  """``mean / p95 / max`` of a list of lengths."""
  ordered = sorted(lengths)
  p95 = ordered[int(0.95 * (len(ordered) - 1))]
  return f"{statistics.mean(ordered):5.1f} / {p95:3d} / {ordered[-1]:3d}"


def eval_pool_size(task, draws: int = 100_000) -> int:
  """Distinct eval prompts seen in ``draws`` samples (a lower bound on the eval pool)."""
  rng = random.Random(0)
  return len({p.prompt for p in (task.sample(rng) for _ in range(draws))
              if is_eval_prompt(p.prompt)})


def describe(name: str, difficulty: int, num_samples: int, n: int) -> None:
  """Print samples and statistics of one task level."""
  task = make_task(name, difficulty)
  problems = [task.problem_at(seed=0, index=i) for i in range(n)]
  prompts = [len(p.prompt) for p in problems]
  solutions = [len(p.solution) for p in problems]
  answers = collections.Counter(p.answer for p in problems)
  mode_share = answers.most_common(1)[0][1] / n
  print(f"\n== {name} difficulty {difficulty}: {task.level}")
  for p in problems[:num_samples]:
    print(f"   {p.prompt!r:26} -> {p.solution!r}")
  print(f"   prompt   chars mean/p95/max {length_summary(prompts)}")
  print(f"   solution chars mean/p95/max {length_summary(solutions)}")
  print(f"   distinct prompts {len({p.prompt for p in problems})}/{n}, answer space "
        f"{len(answers)}, most common answer share {mode_share:.1%}, eval pool "
        f"{eval_pool_size(task)}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", choices=sorted(TASKS), action="append")
  parser.add_argument("--samples", type=int, default=4)
  parser.add_argument("--n", type=int, default=2000, help="problems per level for statistics")
  args = parser.parse_args()
  for name in args.task or sorted(TASKS):
    for difficulty in sorted(TASKS[name].levels):
      describe(name, difficulty, args.samples, args.n)


if __name__ == "__main__":
  main()

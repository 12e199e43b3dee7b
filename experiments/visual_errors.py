"""What the visual task's policy gets wrong on held-out images: each wrong greedy answer is a
misread expression (the transcription before '=' is not the image's), a mis-sum (read right, the
sum after '=' wrong) or an inconsistent answer (both right, the '#' answer not the sum), counted
per held-out expression; for the cold start of `configs/tasks/visual.py` and each run given.

  python experiments/visual_errors.py --sft-dir /tmp/visual/_sft/KEY [RUN_DIR ...] [--num-eval 512]
"""
import argparse
import collections
import re

import jax
import numpy as np

import rljax
from rljax.data import load_tokenizer, make_prompt_source
from rljax.parallel import mesh as mesh_lib
from rljax.train import build, generation, sft

_ANSWER = re.compile(r"(\d+)\+(\d+)=(-?\d+)")


def kind_of(expression: str, text: str) -> str:
  match = _ANSWER.match(text)
  if match is None:
    return "unformatted"
  if f"{match.group(1)}+{match.group(2)}" != expression:
    return "misread"
  if int(match.group(3)) != int(match.group(1)) + int(match.group(2)):
    return "mis-summed"
  return "inconsistent"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sft-dir", required=True)
  parser.add_argument("--num-eval", type=int, default=512)
  parser.add_argument("runs", nargs="*")
  args = parser.parse_args()
  config = rljax.config("configs/tasks/visual.py", {"sft.out_dir": args.sft_dir,
                                                    "data.num_eval": args.num_eval})
  problems = make_prompt_source(config.data, takes_images=True).eval_set(args.num_eval)
  tokenizer = load_tokenizer(config.data.tokenizer)
  cold = rljax.load(sft.ensure_sft_checkpoint(config, tokenizer))
  engine = build.make_engine(config, cold.cfg, mesh_lib.make_mesh(config.mesh), tokenizer)
  generator = build.make_generator(config, engine, tokenizer, source=None)
  greedy = build.sampling_params(config, tokenizer, greedy=True)
  for name, params in [("cold start", cold.params)] + [(d, rljax.load(d).params) for d in args.runs]:
    rollout, texts, _ = generation.generate(generator, params, problems, jax.random.PRNGKey(0),
                                            greedy, 1)
    right = np.asarray(rollout.correct)
    kinds, by_expression = collections.Counter(), collections.Counter()
    for problem, text, ok in zip(problems, texts, right):
      if not ok:
        kinds[kind_of(problem.meta["expression"], text)] += 1
        by_expression[problem.meta["expression"]] += 1
    print(f"{name}: {right.mean():.3f} right of {len(problems)}; wrong: {dict(kinds)}; "
          f"by expression: {by_expression.most_common(6)}")


if __name__ == "__main__":
  main()

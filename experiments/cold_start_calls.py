"""How well a ``tool_calc`` cold start calls the calculator, measured without sampling noise.

  python experiments/cold_start_calls.py DIR [DIR ...] [--config configs/tasks/tool_calc.py]
      [--problems 1024]

For each cold start (an ``sft.out_dir``) on problems of the train split's exact-match stream of
``sft.seed`` (``rljax.train.sft``'s check stream, never the eval split), teacher-forced:

- greedy: the share whose reference greedy decoding writes exactly (``sft.exact_match``);
- sampled: the mean probability that sampling at temperature 1 writes the reference
  (``sft.sampled_match``): a lower bound on the share of a fresh RL run's samples rewarded;
- call: on the references that call the calculator, the mean probability of opening a call
  (the first learned token), and copy: the mean probability of writing the rest of that
  reference (the factors into the call, the result into the answer) once the call is opened.

The start of RL is about sampled (GRPO learns only from groups with a rewarded sample): a cold
start whose copy is low rewards almost nothing, whatever its call rate.
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rljax.config import loader as config_loader  # noqa: E402
from rljax.data import datasets, tokenizer as tokenizer_lib  # noqa: E402
from rljax.models import hf  # noqa: E402
from rljax.models import transformer  # noqa: E402
from rljax.train import sft  # noqa: E402


def token_logp(model_cfg, params, tokens, attn):
  """[B, T-1] log-prob of each next token at temperature 1 (teacher-forced)."""
  hidden, model, _ = transformer.forward_with_routes(model_cfg, params, tokens, attn)
  logits = hidden[:, :-1].astype(jnp.float32) @ model.head_weight().astype(jnp.float32)
  return jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, 1:, None], -1)[..., 0]


def measure(directory: str, config, tokenizer, problems) -> dict:
  model_cfg, params = hf.load_hf(directory)
  width = config.data.prompt_bucket + config.rollout.max_new_tokens
  tokens, attn, learn = sft.make_batch(tokenizer, problems, width, config.env.tool_format)
  args = jnp.asarray(tokens), jnp.asarray(attn), jnp.asarray(learn)
  greedy = float(jax.jit(lambda p, *a: sft.exact_match(model_cfg, p, *a))(params, *args))
  sampled = float(jax.jit(lambda p, *a: sft.sampled_match(model_cfg, p, *a))(params, *args))
  logp = np.asarray(jax.jit(lambda p, t, a: token_logp(model_cfg, p, t, a))(params, *args[:2]))
  mask = learn[:, 1:]
  tool = np.array([bool(p.meta.get("tool")) for p in problems])
  first = mask.argmax(axis=1)  # each row's first learned position
  first_logp = logp[np.arange(len(problems)), first]
  rest = (logp * mask).sum(axis=1) - first_logp
  return {"greedy": greedy, "sampled": sampled, "tool_share": float(tool.mean()),
          "call": float(np.exp(first_logp[tool]).mean()),
          "copy": float(np.exp(rest[tool]).mean())}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("dirs", nargs="+")
  ap.add_argument("--config", default="configs/tasks/tool_calc.py")
  ap.add_argument("--problems", type=int, default=1024)
  a = ap.parse_args(argv)
  print("| cold start | sft.seed | greedy exact | sampled = reference | call | copy after call |")
  print("|---|---|---|---|---|---|")
  for directory in a.dirs:
    stamp = sft.read_stamp(directory) or {}
    seed = stamp.get("sft", {}).get("seed", 1234)
    config = config_loader.load_config(a.config, [("sft.seed", str(seed))])
    tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
    source = datasets.make_prompt_source(config.data,
                                         stream_seed=sft._check_stream_seed(seed))
    r = measure(directory, config, tokenizer, source.next_batch(a.problems))
    print(f"| {directory} | {seed} | {r['greedy']:.3f} | {r['sampled']:.3f} | {r['call']:.3f} | "
          f"{r['copy']:.3f} |")


if __name__ == "__main__":
  main()

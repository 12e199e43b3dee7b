"""LoRA against full fine-tuning: the update's memory at real shapes, the RL step's time on the CPU,
and the merge at every publish.

  python benchmarks/lora.py [--models qwen2.5-0.5b,qwen2.5-7b] [--reps 5] [--smoke]

1. **Memory** of one GRPO update (``train_step``: the policy forward/backward, AdamW, the KL
   reference's log-probs come from scoring) from XLA's memory analysis of the compiled step
   (arguments + outputs + temporaries - donated), compiled from abstract shapes only (nothing is
   allocated, so the 7B step compiles on a laptop): full fine-tuning (float32 master weights,
   AdamW state, a float32 reference copy) against rank 8 and 64 on every projection with the base
   frozen in bfloat16 (``model.lora.base_dtype='compute'``), and rank 8 with a float32 base; one
   row of ``--seq`` tokens, bfloat16 compute, remat none. Beside each: what ``rljax plan`` counts
   for the same run's resident state (params + optimizer state + reference).
2. **Speed** on this CPU, in one process, alternating: score + train_step of a GRPO batch for the
   tiny ``configs/algos/grpo.py`` model, full against rank 8 (the sampler decodes merged weights of
   the base's shapes, so its time is the same either way and is left out), as a ratio; and the merge
   (``rljax.rollout.engines.merged``: one fused ``W + (alpha/r) A @ B`` per kernel) at every
   publish, at the tiny shape and at Qwen2.5-0.5B's.
3. The plan of configs/jobs/qwen7b_lora_1xh100.py (Qwen2.5-7B, LoRA rank 64, one H100 80 GB,
   8k tokens a row) and of the same run as a full fine-tune.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rljax.config import loader as config_loader  # noqa: E402
from rljax import plan as plan_lib  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.data import tokenizer as tokenizer_lib  # noqa: E402
from rljax.models import lora, transformer  # noqa: E402
from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax.rollout import engines  # noqa: E402
from rljax.rollout.record import Rollout  # noqa: E402
from rljax.train import build  # noqa: E402
from rljax.learner import step as step_lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1024 ** 3
# (label, model.lora.rank, model.lora.base_dtype)
SETTINGS = (("full fine-tune", 0, "param"), ("LoRA r=8, base bf16", 8, "compute"),
            ("LoRA r=64, base bf16", 64, "compute"), ("LoRA r=8, base f32", 8, "param"))


def grpo_config(overrides: dict):
  return config_loader.load_config(os.path.join(ROOT, "configs", "algos", "grpo.py"),
                                   [(k, str(v)) for k, v in overrides.items()])


def update_settings(rows: int, seq: int, prompt: int, rank: int, base_dtype: str) -> dict:
  settings = {"rollout.prompts_per_step": 1, "rollout.group_size": rows,
              "rollout.max_new_tokens": seq - prompt, "data.prompt_bucket": prompt,
              "model.dtype": "bfloat16", "model.lora.rank": rank}
  if rank:
    settings["model.lora.base_dtype"] = base_dtype
  return settings


def synthetic_rollout(vocab: int, rows: int, prompt: int, completion: int) -> Rollout:
  """Full-length rows of random tokens, rewards alternating 0 / 1 (a group with a spread)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, vocab, (rows, prompt + completion)).astype(np.int32)
  rewards = (np.arange(rows) % 2).astype(np.float32)
  zeros = np.zeros((rows, completion), np.float32)
  return Rollout(prompt_tokens=tokens[:, :prompt], prompt_mask=np.ones((rows, prompt), np.int32),
                 tokens=tokens[:, prompt:], mask=np.ones((rows, completion), np.int32),
                 sampler_logp=zeros, draw_logp=zeros,
                 lengths=np.full(rows, completion, np.int32), truncated=np.ones(rows, bool),
                 rewards=rewards, correct=rewards > 0, row_valid=np.ones(rows, np.float32))


def update_memory(name: str, rows: int, seq: int, prompt: int, rank: int, base_dtype: str,
                  layers: int | None) -> tuple[dict, dict]:
  """(XLA's memory analysis of the compiled train_step, the plan's bytes) from abstract shapes;
  ``layers``: the model's first ``layers`` layers only (None: all)."""
  config = grpo_config(update_settings(rows, seq, prompt, rank, base_dtype))
  _, cfg = plan_lib.model_config(config, name, "accelerator")
  if layers:
    cfg = cfg.replace(num_layers=layers)
  algo = resolve(config)
  shapes, _ = build.abstract_state(config, cfg, algo)
  fns = step_lib.step_fns(build.step_spec(config, cfg, algo))
  rollout = jax.eval_shape(lambda: jax.tree.map(
      np.asarray, synthetic_rollout(cfg.vocab_size, rows, prompt, seq - prompt)))
  batch = jax.eval_shape(fns.score, shapes, rollout, algo.hparams)[0]
  compiled = jax.jit(fns.train_step, donate_argnums=0).lower(shapes, batch,
                                                            algo.hparams).compile()
  m = compiled.memory_analysis()
  xla = dict(arguments=m.argument_size_in_bytes, temporaries=m.temp_size_in_bytes,
             total=(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                    - m.alias_size_in_bytes))
  p = plan_lib.plan(config, "1xcpu", model=name, prompt_len=prompt)["bytes"]
  return xla, p


def memory_table(models, rows: int, seq: int, prompt: int, layers: int | None) -> None:
  depth = f"the first {layers} layers" if layers else "all layers"
  print(f"\n## Update memory, XLA's analysis of the compiled step ({rows} x {seq} tokens, bf16 "
        f"compute, remat none, {depth}; the plan's column: the whole model)\n")
  print("| model | setting | state + batch (arguments) GiB | temporaries GiB | total GiB | "
        "x full | plan: params + opt + ref GiB | compile s |")
  print("|---|---|---|---|---|---|---|---|")
  for name in models:
    full = None
    for label, rank, base_dtype in SETTINGS:
      t0 = time.perf_counter()
      xla, p = update_memory(name, rows, seq, prompt, rank, base_dtype, layers)
      seconds = time.perf_counter() - t0
      full = full or xla["total"]
      resident = p["params"] + p["opt_state"] + p["reference"]
      print(f"| {name} | {label} | {xla['arguments'] / GiB:.2f} | {xla['temporaries'] / GiB:.2f} "
            f"| {xla['total'] / GiB:.2f} | {xla['total'] / full:.3f} | {resident / GiB:.2f} | "
            f"{seconds:.0f} |", flush=True)


def timed(fn, reps: int) -> float:
  fn()  # compile
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def step_fn(rank: int, rows: int, prompt: int, completion: int):
  """A function running score + train_step once on the tiny grpo model, ``rank`` adapters."""
  config = grpo_config({"rollout.prompts_per_step": 1, "rollout.group_size": rows,
                        "rollout.max_new_tokens": completion, "data.prompt_bucket": prompt,
                        "model.lora.rank": rank, "optim.lr": "1e-5"})
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  cfg, params = build.load_policy(config, tokenizer)
  state, fns, _ = build.sharded_state_and_fns(config, cfg, params,
                                              mesh_lib.make_mesh(config.mesh))
  hp = resolve(config).hparams
  rollout = synthetic_rollout(cfg.vocab_size, rows, prompt, completion)
  holder = {"state": state}

  def run():
    batch, _ = fns.score(holder["state"], rollout, hp)
    holder["state"], metrics = fns.train_step(holder["state"], batch, hp)
    jax.block_until_ready((holder["state"], metrics))
  return run, cfg, holder


def speed_table(reps: int, rows: int, prompt: int, completion: int, merge_models) -> None:
  print(f"\n## RL update on this CPU (score + train_step, tiny grpo model, {rows} x "
        f"{prompt}+{completion} tokens), one process, alternating\n")
  full_run, _, _ = step_fn(0, rows, prompt, completion)
  lora_run, cfg, holder = step_fn(8, rows, prompt, completion)
  full_s, lora_s = [], []
  for _ in range(3):
    full_s.append(timed(full_run, reps))
    lora_s.append(timed(lora_run, reps))
  f, l = statistics.median(full_s), statistics.median(lora_s)
  print("| setting | median s | LoRA / full |")
  print("|---|---|---|")
  print(f"| full fine-tune | {f:.4f} | |")
  print(f"| LoRA r=8 | {l:.4f} | {l / f:.3f} |")
  print("\n## The merge at publish (`engines.merged`, one fused op per kernel)\n")
  print("| model | rank | merge s | of the tiny update |")
  print("|---|---|---|---|")
  params = holder["state"].params
  merge = timed(lambda: engines.merged(cfg, params), reps)
  print(f"| tiny grpo | 8 | {merge:.4f} | {merge / l:.3f} |", flush=True)
  for name in merge_models:
    config = grpo_config({"model.lora.rank": 8, "model.dtype": "float32"})
    _, big = plan_lib.model_config(config, name, "cpu")
    big_params = transformer.init_params(big, seed=0)
    seconds = timed(lambda: engines.merged(big, big_params), max(2, reps // 2))
    print(f"| {name} | 8 | {seconds:.3f} | |", flush=True)
    del big_params


def plan_table() -> None:
  print("\n## rljax plan: Qwen2.5-7B GRPO on one H100 80 GB at 8k tokens a row "
        "(configs/jobs/qwen7b_lora_1xh100.py)\n")
  print("| setting | params GiB | adapters GiB | optimizer GiB | reference GiB | "
        "merged kernels GiB | peak GiB | fits |")
  print("|---|---|---|---|---|---|---|---|")
  path = os.path.join(ROOT, "configs", "jobs", "qwen7b_lora_1xh100.py")
  for label, rank, base_dtype in (("LoRA r=64, base bf16", 64, "compute"),
                                  ("LoRA r=8, base bf16", 8, "compute"),
                                  ("full fine-tune", 0, "param")):
    overrides = [("model.lora.rank", str(rank))]
    if not rank:
      overrides.append(("model.lora.base_dtype", base_dtype))
    p = plan_lib.plan(config_loader.load_config(path, overrides))
    by = p["bytes"]
    print(f"| {label} | {by['params'] / GiB:.2f} | {by['adapters'] / GiB:.2f} | "
          f"{by['opt_state'] / GiB:.2f} | {by['reference'] / GiB:.2f} | "
          f"{by['merged_weights'] / GiB:.2f} | {p['peak'] / GiB:.2f} | "
          f"{'yes' if p['fits'] else 'no'} |", flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-7b")
  parser.add_argument("--seq", type=int, default=1024, help="tokens of the update's row")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--layers", type=int, default=0,
                      help="compile the memory table's models with their first N layers only "
                           "(0: all; XLA:CPU takes over 20 min for the full 0.5B step)")
  parser.add_argument("--smoke", action="store_true", help="0.5B memory only, 2 reps, no plan")
  args = parser.parse_args(argv)
  models = ["qwen2.5-0.5b"] if args.smoke else args.models.split(",")
  print(f"# jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs")
  memory_table(models, 2, 256 if args.smoke else args.seq, 128, args.layers or None)
  speed_table(2 if args.smoke else args.reps, 8, 32, 64,
              [] if args.smoke else ["qwen2.5-0.5b"])
  if not args.smoke:
    plan_table()


if __name__ == "__main__":
  main()

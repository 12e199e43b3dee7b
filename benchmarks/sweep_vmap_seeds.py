"""Would a study run its seeds in one process, vmapped over a seed axis, faster than one by one?

  python benchmarks/sweep_vmap_seeds.py [--seeds 3] [--steps 5]

One RL step at the study scale (configs/studies/arith_l1_grpo.py: ~0.8M-parameter Llama, hidden 128,
4 layers; 8 prompts x 8 completions, 16 prompt tokens, 28 new tokens sampled without early stop,
GRPO scoring and update) for N independent seeds, timed two ways in the same process:

* sequential: the jitted sampler, prepare_batch and train_step called once per seed;
* vmapped: the same pure functions under ``jax.vmap`` over a leading seed axis of the train state,
  prompts, keys and rollouts, jitted once, called once for all seeds.

Prints the median seconds per step of each phase and the ratio sequential / vmapped (> 1: the
seed axis pays off). Rewards are random (no verifier: its cost is the same either way).
"""
import argparse
import functools
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rljax.config import loader as config_loader  # noqa: E402
from rljax.models import transformer, tiny_config# noqa: E402
from rljax.rollout import SamplingParams  # noqa: E402
from rljax.rollout import sampler as sampler_lib  # noqa: E402
from rljax.train import build  # noqa: E402
from rljax.learner import step as step_lib  # noqa: E402

VOCAB = 48


def setup(num_seeds: int):
  config = config_loader.load_config(os.path.join(ROOT, "configs", "studies", "arith_l1_grpo.py"),
                                     [("model.source", "tiny")])
  model_cfg = tiny_config(config.model, VOCAB)
  actor_tx, critic_tx = build.optimizers(config)
  _, make = build.abstract_state(config, model_cfg)
  states = [make(transformer.init_params(model_cfg, seed=s)) for s in range(num_seeds)]
  fns = step_lib.build_step_fns(config, model_cfg, actor_tx, critic_tx)
  sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, greedy=False,
                      max_new_tokens=config.rollout.max_new_tokens, stop_ids=(), pad_id=0)
  sample = functools.partial(sampler_lib._sample_impl, cfg=model_cfg, sp=sp,
                             group_size=config.rollout.group_size)
  p, width = config.rollout.prompts_per_step, config.data.prompt_bucket
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, VOCAB, (num_seeds, p, width)).astype(np.int32)
  return config, states, fns, sample, prompts


def update_inputs(out, rewards):
  """prepare_batch's rollout arguments from a sampler output (any leading axes)."""
  tokens = jnp.concatenate([out.prompt_tokens, out.tokens], -1)
  attn = jnp.concatenate([out.prompt_mask, out.mask], -1).astype(jnp.int32)
  return (tokens, attn, out.mask.astype(jnp.float32), out.logp, rewards,
          jnp.zeros_like(rewards), jnp.ones_like(rewards))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args()
  n = args.seeds
  config, states, fns, sample, prompts = setup(n)
  rows = config.rollout.prompts_per_step * config.rollout.group_size
  mask = np.ones_like(prompts[0])

  sample_one = jax.jit(sample)
  prepare_one, train_one = jax.jit(fns.prepare_batch), jax.jit(fns.train_step)
  sample_all = jax.jit(jax.vmap(sample))
  prepare_all, train_all = jax.jit(jax.vmap(fns.prepare_batch)), jax.jit(jax.vmap(fns.train_step))
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *states)

  def sequential(i):
    t0 = time.perf_counter()
    outs = [jax.block_until_ready(sample_one(s.params, prompts[k], mask, jax.random.PRNGKey(i + k)))
            for k, s in enumerate(states)]
    t1 = time.perf_counter()
    for k, out in enumerate(outs):
      rewards = jnp.asarray(np.random.default_rng(i + k).integers(0, 2, rows), jnp.float32)
      batch, _ = prepare_one(states[k], *update_inputs(out, rewards))
      states[k], metrics = train_one(states[k], batch)
      jax.block_until_ready(metrics)
    return t1 - t0, time.perf_counter() - t1

  def vmapped(i):
    nonlocal stacked
    t0 = time.perf_counter()
    keys = jnp.stack([jax.random.PRNGKey(i + k) for k in range(n)])
    out = jax.block_until_ready(sample_all(stacked.params, prompts, np.stack([mask] * n), keys))
    t1 = time.perf_counter()
    rewards = jnp.asarray(np.stack([np.random.default_rng(i + k).integers(0, 2, rows)
                                    for k in range(n)]), jnp.float32)
    batch, _ = prepare_all(stacked, *update_inputs(out, rewards))
    stacked, metrics = train_all(stacked, batch)
    jax.block_until_ready(metrics)
    return t1 - t0, time.perf_counter() - t1

  results = {}
  for name, fn in (("sequential", sequential), ("vmapped", vmapped)):
    fn(0)  # compile
    times = [fn(i + 1) for i in range(args.steps)]
    results[name] = [statistics.median(t[j] for t in times) for j in range(2)]
  print(f"{n} seeds, median of {args.steps} steps, jax {jax.__version__}, "
        f"{jax.devices()[0].platform}")
  print("| phase | sequential s | vmapped s | sequential / vmapped |\n|---|---|---|---|")
  for j, phase in enumerate(("rollout", "update")):
    s, v = results["sequential"][j], results["vmapped"][j]
    print(f"| {phase} | {s:.3f} | {v:.3f} | {s / v:.2f}x |")
  s, v = sum(results["sequential"]), sum(results["vmapped"])
  print(f"| whole step | {s:.3f} | {v:.3f} | **{s / v:.2f}x** |")


if __name__ == "__main__":
  main()

"""Context parallelism (``mesh.context``) on simulated CPU devices: per-device memory of the
update and of the sampler's KV cache by XLA's own accounting, and the update's time, at context
N against N = 1.

- memory: the compiled GRPO ``train_step`` (``rljax.train.build``: score's output fed in; model
  ``--hidden``/``--layers``, remat full, layers scanned, blockwise attention) of ``--rows`` rows
  of ``T`` tokens per length, on a mesh of ``context=N`` devices: ``memory_analysis()
  .temp_size_in_bytes`` of the per-device program, and the same of the all-rows sampler (its KV
  cache of ``T`` slots is a temporary of the compiled sampler) decoding ``T - 8`` tokens after an
  8-token prompt. Nothing runs: compile only.
- time (``--time_len``): the mean wall time of the compiled ``train_step`` at context N. On one
  CPU the N simulated devices share its cores, so this measures what the split costs (the ring's
  transfers, the folding, N programs instead of one), not a speed-up: that needs N real
  devices.

- balance (``--balance``): why the rows are striped. The blockwise kernel's own block ranges
  (``attention._key_block_range``) give the (query block, key block) tiles each device computes
  at each ring step of one causal row; a step ends when its slowest device does, so the
  critical path is the sum over steps of the most tiles any device computes, against the ideal
  (all tiles / N). Striped slots against contiguous pieces.

  python benchmarks/context_parallel.py --lengths 16384,32768 --contexts 1,2,4,8 --time_len 2048
  python benchmarks/context_parallel.py --balance --lengths 16384 --contexts 2,4,8 --no_memory

Sets ``XLA_FLAGS=--xla_force_host_platform_device_count=<max context>`` itself (before JAX
starts) unless XLA_FLAGS already force a count.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args():
  ap = argparse.ArgumentParser()
  ap.add_argument("--lengths", default="16384", help="tokens per row for the memory table")
  ap.add_argument("--contexts", default="1,2,4,8")
  ap.add_argument("--rows", type=int, default=2, help="rows of the batch (one group)")
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--time_len", type=int, default=0, help="also time the update at this length")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--no_sampler", action="store_true", help="skip the sampler's memory")
  ap.add_argument("--no_memory", action="store_true", help="skip the memory table")
  ap.add_argument("--balance", action="store_true", help="ring work per device: striped/contiguous")
  ap.add_argument("--block", type=int, default=128, help="the kernel's block (--balance)")
  ap.add_argument("--smoke", action="store_true", help="tiny: lengths 256, contexts 1,2")
  return ap.parse_args()


ARGS = _args()
if ARGS.smoke:
  ARGS.lengths, ARGS.contexts, ARGS.hidden, ARGS.layers, ARGS.time_len = "256", "1,2", 32, 2, 128
CONTEXTS = [int(c) for c in ARGS.contexts.split(",")]
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={max(CONTEXTS)}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rljax.algorithm import resolve  # noqa: E402
from rljax.config import loader as config_loader  # noqa: E402
from rljax.models import attention as attention_lib  # noqa: E402
from rljax.data.tokenizer import load_tokenizer  # noqa: E402
from rljax.models import tiny_config, transformer  # noqa: E402
from rljax.parallel import mesh as mesh_lib, rules  # noqa: E402
from rljax.rollout import sampler as sampler_lib  # noqa: E402
from rljax.rollout.record import Rollout  # noqa: E402
from rljax.rollout.sampling import SamplingParams  # noqa: E402
from rljax.train import build, loop  # noqa: E402

PROMPT = 8
MiB = 2 ** 20


def setup(length: int, context: int):
  """(config, model config, params, mesh) of ``--rows`` rows of ``length`` tokens."""
  tok = load_tokenizer("char")
  heads = max(2, ARGS.hidden // 32)
  overrides = {
      "model.hidden_size": ARGS.hidden, "model.intermediate_size": 3 * ARGS.hidden,
      "model.num_layers": ARGS.layers, "model.num_heads": heads,
      "model.num_kv_heads": heads // 2, "model.remat": "full", "model.scan_layers": True,
      "model.attention": "blockwise", "model.forward_tokens": 0, "model.parallel_chunks": 1,
      "model.logits_chunk": 256, "rollout.prompts_per_step": 1, "rollout.group_size": ARGS.rows,
      "rollout.max_new_tokens": length - PROMPT, "algo.minibatches": 1, "algo.micro_batches": 1,
      "algo.kl_placement": "none", "mesh.data": 1, "mesh.context": context}
  config = config_loader.load_config(os.path.join(ROOT, "configs", "algos", "grpo.py"),
                                     [(k, str(v)) for k, v in overrides.items()])
  cfg = tiny_config(config.model, tok.vocab_size, eos_token_id=tok.eos_id,
                    pad_token_id=tok.pad_id)
  mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:context])
  return config, cfg, transformer.init_params(cfg, seed=0), mesh, tok


def rollout(rows: int, length: int, vocab: int) -> Rollout:
  """Every completion full: ``length - PROMPT`` tokens after a prompt of ``PROMPT``."""
  rng = np.random.default_rng(0)
  t = length - PROMPT
  zeros = np.zeros((rows, t), np.float32)
  return Rollout(prompt_tokens=rng.integers(3, vocab, (rows, PROMPT)).astype(np.int32),
                 prompt_mask=np.ones((rows, PROMPT), np.int32),
                 tokens=rng.integers(3, vocab, (rows, t)).astype(np.int32),
                 mask=np.ones((rows, t), np.int32), sampler_logp=zeros, draw_logp=zeros,
                 lengths=np.full(rows, t, np.int32), truncated=np.zeros(rows, bool),
                 rewards=np.arange(rows, dtype=np.float32), correct=np.ones(rows, bool),
                 row_valid=np.ones(rows, np.float32))


def update(length: int, context: int, run: bool):
  """(compiled train_step's temp MiB, mean seconds per step or None)."""
  config, cfg, params, mesh, tok = setup(length, context)
  state, fns, _ = build.sharded_state_and_fns(config, cfg, params, mesh)
  hp = resolve(config).hparams
  batch = loop.to_device(rollout(ARGS.rows, length, tok.vocab_size), mesh)
  if run:
    scored, _ = fns.score(state, batch, hp)
  else:  # shapes and shardings only: nothing is computed
    out = fns.score.lower(state, batch, hp).out_info[0]
    scored = jax.tree.map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding),
                          out)
  compiled = fns.train_step.lower(state, scored, hp).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes / MiB
  if not run:
    return temp, None
  state, _ = fns.train_step(state, scored, hp)  # warm
  jax.block_until_ready(state.params)
  start = time.perf_counter()
  for _ in range(ARGS.repeats):
    state, metrics = fns.train_step(state, scored, hp)
    jax.block_until_ready(metrics)
  return temp, (time.perf_counter() - start) / ARGS.repeats


def sampler_memory(length: int, context: int) -> float:
  """The compiled all-rows sampler's temp MiB decoding ``length - PROMPT`` tokens per row."""
  config, cfg, params, mesh, tok = setup(length, context)
  sp = SamplingParams(greedy=True, max_new_tokens=length - PROMPT, stop_ids=(), pad_id=0)
  fn = sampler_lib.make_sampler(cfg, sp, ARGS.rows, mesh=mesh, data_axis=rules.batch_axes(),
                                context=rules.context_layout(mesh))
  prompts = jax.ShapeDtypeStruct((1, PROMPT), np.int32)
  key = jax.eval_shape(lambda: jax.random.key(0))
  compiled = fn.jitted.lower(params, prompts, prompts, key).compile()
  return compiled.memory_analysis().temp_size_in_bytes / MiB


def ring_tiles(length: int, n: int, striped: bool) -> tuple[int, int]:
  """(critical-path tiles, all tiles / n) of one causal row of ``length`` slots on ``n``
  devices: per step, the most tiles any device computes, summed over the steps."""
  sl = length // n
  bq = bk = attention_lib.balanced_block(sl, ARGS.block)
  nq = nk = sl // bq
  path, total = 0, 0
  for step in range(n):
    most = 0
    for c in range(n):
      src = (c - step) % n
      q0, k0, stride = (c, src, n) if striped else (c * sl, src * sl, 1)
      tiles = 0
      for i in range(nq):
        first = q0 + stride * i * bq
        lo, hi = attention_lib._key_block_range(first, first + stride * (bq - 1), k0, stride,
                                                 bk, nk, None, 0)
        tiles += max(0, int(hi) - int(lo))
      most, total = max(most, tiles), total + tiles
    path += most
  return path, total // n


def balance():
  print("\n| T | context | layout | critical-path tiles | ideal | x ideal |\n"
        "|---|---|---|---|---|---|")
  for length in [int(x) for x in ARGS.lengths.split(",")]:
    for n in [c for c in CONTEXTS if c > 1]:
      for striped in (True, False):
        path, ideal = ring_tiles(length, n, striped)
        print(f"| {length} | {n} | {'striped' if striped else 'contiguous'} | {path} | {ideal} | "
              f"{path / ideal:.2f} |", flush=True)


def main():
  print(f"model D={ARGS.hidden} L={ARGS.layers} (remat full, scanned, blockwise); "
        f"rows={ARGS.rows}; {jax.device_count()} simulated CPU devices")
  if ARGS.balance:
    balance()
  if not ARGS.no_memory:
    memory_table()
  if ARGS.time_len:
    time_table()


def memory_table():
  print("\n| T | context | update temp MiB / device | x context 1 | sampler temp MiB / device "
        "| x context 1 |")
  print("|---|---|---|---|---|---|")
  for length in [int(x) for x in ARGS.lengths.split(",")]:
    base = None
    for context in CONTEXTS:
      temp, _ = update(length, context, run=False)
      cache = float("nan") if ARGS.no_sampler else sampler_memory(length, context)
      base = base or (temp, cache)
      print(f"| {length} | {context} | {temp:.1f} | {temp / base[0]:.3f} | {cache:.1f} | "
            f"{cache / base[1]:.3f} |", flush=True)


def time_table():
  print("\n| T | context | update s | x context 1 |\n|---|---|---|---|")
  base = None
  for context in [c for c in CONTEXTS if c <= 4]:
    _, secs = update(ARGS.time_len, context, run=True)
    base = base or secs
    print(f"| {ARGS.time_len} | {context} | {secs:.3f} | {secs / base:.2f} |", flush=True)


if __name__ == "__main__":
  main()

"""Train-step memory and time at long sequence lengths: attention backend x remat policy.

For a small Llama (``--hidden/--layers``) and one row of ``T`` tokens, compiles the gradient of
the train step's loss path (model forward, chunked log-probs, backward) and prints XLA's own
temporary-memory accounting (``compiled.memory_analysis().temp_size_in_bytes``) and the mean
wall time of a step, with ratios against the peer in the same run (the materialised ``xla``
attention without remat at the same T).

  PYTHONPATH=. python benchmarks/long_sequence.py --lengths 1024,2048,4096,8192
"""
from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax import algos
from rljax.models import ModelConfig, llama


def loss(cfg, params, tokens, mask):
  """The policy-gradient path's forward: hidden -> chunked token log-probs -> a scalar."""
  model = llama.bind(cfg, params)
  hidden, _ = model(tokens, llama.positions_from_mask(mask), attn_mask=mask)
  logp, _ = algos.token_logprobs_and_entropy(hidden[:, :-1], model.head_weight(), tokens[:, 1:],
                                             chunk=512)
  return -(logp * mask[:, 1:]).sum()


def compiled_grad(cfg, params, rows, length):
  spec = jax.ShapeDtypeStruct((rows, length), jnp.int32)
  return jax.jit(jax.grad(functools.partial(loss, cfg))).lower(params, spec, spec).compile()


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--lengths", default="1024,2048,4096,8192")
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--rows", type=int, default=1)
  ap.add_argument("--xla_max_len", type=int, default=2048, help="longest T for the T^2 peer")
  ap.add_argument("--time_max_len", type=int, default=2048, help="longest T that is also timed")
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  base = ModelConfig(vocab_size=512, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                     num_layers=args.layers, num_heads=4, num_kv_heads=2,
                     head_dim=args.hidden // 4)
  params = llama.init_params(base)
  print(f"model D={args.hidden} L={args.layers} V=512 H=4 G=2; rows={args.rows}; "
        f"backend={jax.default_backend()}; {jax.device_count()} device(s)")
  print(f"{'T':>6} {'attention':>10} {'remat':>5} {'temp MiB':>9} {'x peer':>7} "
        f"{'step s':>7} {'x peer':>7}")
  for t in [int(x) for x in args.lengths.split(",")]:
    rng = np.random.default_rng(t)
    tokens = jnp.asarray(rng.integers(3, 512, (args.rows, t)), jnp.int32)
    mask = jnp.ones((args.rows, t), jnp.int32).at[:, : t // 8].set(0)  # left padding
    peer_mem = peer_time = None
    for attention in ("xla", "blockwise"):
      if attention == "xla" and t > args.xla_max_len:
        continue
      for remat in ("none", "full", "dots"):
        cfg = base.replace(attention=attention, remat=remat)
        fn = compiled_grad(cfg, params, args.rows, t)
        mem = fn.memory_analysis().temp_size_in_bytes / 2 ** 20
        secs = float("nan")
        if t <= args.time_max_len:
          jax.block_until_ready(fn(params, tokens, mask))
          start = time.perf_counter()
          for _ in range(args.repeats):
            jax.block_until_ready(fn(params, tokens, mask))
          secs = (time.perf_counter() - start) / args.repeats
        if attention == "xla" and remat == "none":
          peer_mem, peer_time = mem, secs
        ratio_m = f"{mem / peer_mem:7.2f}" if peer_mem else "      -"
        ratio_t = f"{secs / peer_time:7.2f}" if peer_time and secs == secs else "      -"
        print(f"{t:>6} {attention:>10} {remat:>5} {mem:9.1f} {ratio_m} {secs:7.3f} {ratio_t}",
              flush=True)


if __name__ == "__main__":
  main()

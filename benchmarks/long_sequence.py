"""Train-step memory and time at long sequence lengths: attention backend x remat x layer layout.

For a small Llama (``--hidden/--layers``) and one row of ``T`` tokens, compiles the gradient of
the train step's loss path (model forward, chunked log-probs, backward) and prints XLA's own
temporary-memory accounting (``compiled.memory_analysis().temp_size_in_bytes``) and the mean
wall time of a step, with ratios against two peers in the same run: the materialised ``xla``
attention without remat, unrolled, at the same T ("x peer"), and the same attention and remat
with the unrolled layer loop ("x unrolled", for the ``scan`` layout: ``model.scan_layers``).
``--compile_layers N`` also times the compilation of an N-layer model's gradient, unrolled
against scanned.

  PYTHONPATH=. python benchmarks/long_sequence.py --lengths 1024,2048,4096,8192
  PYTHONPATH=. python benchmarks/long_sequence.py --attentions blockwise --layouts unrolled,scan \
      --time_max_len 8192 --compile_layers 24
"""
from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax import algos
from rljax.models import ModelConfig, transformer

LAYOUTS = {"unrolled": False, "scan": True}


def loss(cfg, params, tokens, mask):
  """The policy-gradient path's forward: hidden -> chunked token log-probs -> a scalar."""
  hidden, model, _ = transformer.forward_with_routes(cfg, params, tokens, mask)
  logp, _ = algos.token_logprobs_and_entropy(hidden[:, :-1], model.head_weight(), tokens[:, 1:],
                                             chunk=512)
  return -(logp * mask[:, 1:]).sum()


def compiled_grad(cfg, params, rows, length):
  spec = jax.ShapeDtypeStruct((rows, length), jnp.int32)
  return jax.jit(jax.grad(functools.partial(loss, cfg))).lower(params, spec, spec).compile()


def model_config(hidden, layers, **kw):
  return ModelConfig(vocab_size=512, hidden_size=hidden, intermediate_size=3 * hidden,
                     num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4, **kw)


def compile_times(hidden, layers, length, remats):
  """Seconds to lower and compile the gradient of a ``layers``-deep model, unrolled vs scan."""
  print(f"\ncompile time: D={hidden} L={layers} T={length}, blockwise attention")
  print(f"{'remat':>5} {'unrolled s':>10} {'scan s':>7} {'scan/unrolled':>13}")
  for remat in remats:
    secs = {}
    for layout, scan in LAYOUTS.items():
      cfg = model_config(hidden, layers, attention="blockwise", remat=remat, scan_layers=scan)
      params = jax.eval_shape(functools.partial(transformer.init_params, cfg))
      start = time.perf_counter()
      compiled_grad(cfg, params, 1, length)
      secs[layout] = time.perf_counter() - start
    print(f"{remat:>5} {secs['unrolled']:10.2f} {secs['scan']:7.2f} "
          f"{secs['scan'] / secs['unrolled']:13.2f}", flush=True)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--lengths", default="1024,2048,4096,8192")
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--rows", type=int, default=1)
  ap.add_argument("--attentions", default="xla,blockwise")
  ap.add_argument("--layouts", default="unrolled", help="unrolled,scan (model.scan_layers)")
  ap.add_argument("--remats", default="none,full,dots")
  ap.add_argument("--xla_max_len", type=int, default=2048, help="longest T for the T^2 peer")
  ap.add_argument("--time_max_len", type=int, default=2048, help="longest T that is also timed")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--compile_layers", type=int, default=0, help="also time compiling this deep")
  ap.add_argument("--compile_len", type=int, default=1024)
  args = ap.parse_args()
  layouts = args.layouts.split(",")
  unknown = [x for x in layouts if x not in LAYOUTS]
  if unknown:
    raise SystemExit(f"--layouts: unknown {unknown}; choose from {list(LAYOUTS)}")
  remats = args.remats.split(",")
  base = model_config(args.hidden, args.layers)
  params = transformer.init_params(base)
  print(f"model D={args.hidden} L={args.layers} V=512 H=4 G=2; rows={args.rows}; "
        f"backend={jax.default_backend()}; {jax.device_count()} device(s)")
  print(f"{'T':>6} {'attention':>10} {'remat':>5} {'layout':>8} {'temp MiB':>9} {'x peer':>7} "
        f"{'x unrolled':>10} {'step s':>7} {'x peer':>7} {'x unrolled':>10}")
  ratio = lambda a, b: f"{a / b:.2f}" if b and a == a and b == b else "-"  # noqa: E731
  for t in [int(x) for x in args.lengths.split(",")]:
    rng = np.random.default_rng(t)
    tokens = jnp.asarray(rng.integers(3, 512, (args.rows, t)), jnp.int32)
    mask = jnp.ones((args.rows, t), jnp.int32).at[:, : t // 8].set(0)  # left padding
    peer = None
    for attention in args.attentions.split(","):
      if attention == "xla" and t > args.xla_max_len:
        continue
      for remat in remats:
        unrolled = None
        for layout in layouts:
          cfg = base.replace(attention=attention, remat=remat, scan_layers=LAYOUTS[layout])
          fn = compiled_grad(cfg, params, args.rows, t)
          mem = fn.memory_analysis().temp_size_in_bytes / 2 ** 20
          secs = float("nan")
          if t <= args.time_max_len:
            jax.block_until_ready(fn(params, tokens, mask))
            start = time.perf_counter()
            for _ in range(args.repeats):
              jax.block_until_ready(fn(params, tokens, mask))
            secs = (time.perf_counter() - start) / args.repeats
          if attention == "xla" and remat == "none" and layout == "unrolled":
            peer = (mem, secs)
          if layout == "unrolled":
            unrolled = (mem, secs)
          pm, pt = peer or (None, None)
          um, ut = unrolled or (None, None)
          print(f"{t:>6} {attention:>10} {remat:>5} {layout:>8} {mem:9.1f} {ratio(mem, pm):>7} "
                f"{ratio(mem, um):>10} {secs:7.3f} {ratio(secs, pt):>7} {ratio(secs, ut):>10}",
                flush=True)
  if args.compile_layers:
    compile_times(args.hidden, args.compile_layers, args.compile_len, remats)


if __name__ == "__main__":
  main()

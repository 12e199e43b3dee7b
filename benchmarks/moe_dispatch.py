"""The MoE block's dispatches against each other: XLA's FLOP count and the step time of a
forward + backward, at E = 64 experts, k = 8 per token.

  python benchmarks/moe_dispatch.py [--tokens 2048,64] [--repeats 7]
  python benchmarks/moe_dispatch.py --smoke      # a tiny shape, in seconds (the test)

For each token count T, one jitted ``value_and_grad`` of ``sum(y * c) + aux_loss`` over the
block's parameters and its input (``rljax.models.moe.MoE``, float32) per dispatch:

- ``dense``: every expert on every token (the reference);
- ``sparse``: the dropless block-padded grouped matmuls (``model.moe_dispatch=sparse``);
- ``ragged_dot``: the same sorted pairs through ``jax.lax.ragged_dot`` (not a dispatch of the
  model: measured to show what XLA makes of it on this backend).

Printed: the compiled program's FLOPs (``cost_analysis()``) and their ratio to dense, next to
``k/E``; the median seconds of one call over ``--repeats`` rounds that call every dispatch in
turn (interleaved, so a change in the machine's load slows all of them alike) and the ratio of
those medians to dense; and the largest difference of each output and gradient from dense,
relative to the largest dense value.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rljax.models import moe  # noqa: E402

SHAPE = dict(hidden=64, width=32, experts=64, k=8)
SMOKE_SHAPE = dict(hidden=16, width=8, experts=8, k=2)
RAGGED = "ragged_dot"


def ragged_dot_experts(x, routes, gates, gate, up, down):
  """``moe.sparse_experts``' contraction with ``jax.lax.ragged_dot``: pairs sorted by expert,
  groups of their sizes, no padding."""
  num_tokens, k = routes.shape
  experts = routes.reshape(-1)
  order = jnp.argsort(experts, stable=True)
  sizes = jnp.bincount(experts, length=gate.shape[0]).astype(jnp.int32)
  rows = x[order // k]
  hidden = (jax.nn.silu(jax.lax.ragged_dot(rows, gate, sizes))
            * jax.lax.ragged_dot(rows, up, sizes))
  out = jax.lax.ragged_dot(hidden, down, sizes)
  unsorted = jnp.zeros_like(out).at[order].set(out)
  return jnp.einsum("tkd,tk->td", unsorted.reshape(num_tokens, k, -1), gates)


def block_step(shape: dict, dispatch: str):
  """``(jitted value_and_grad, state)`` of one MoE block with ``dispatch``; ``ragged_dot`` swaps
  the sparse dispatch's grouped matmuls for ``ragged_dot_experts``."""
  block = moe.MoE(hidden_size=shape["hidden"], moe_intermediate_size=shape["width"],
                  num_experts=shape["experts"], experts_per_token=shape["k"],
                  norm_topk_prob=True, param_dtype="float32", dtype="float32",
                  rngs=nnx.Rngs(0), dispatch="dense" if dispatch == RAGGED else dispatch)
  graphdef, state = nnx.split(block)

  def loss(st, x, cotangent):
    module = nnx.merge(graphdef, st)
    if dispatch == RAGGED:
      # The block's routing, then the experts by ragged_dot.
      tokens = x.reshape(-1, x.shape[-1])
      probs = moe.router_probs(module.router(tokens))
      gates, routes = moe.top_k_gates(probs, module.experts_per_token, True)
      y = ragged_dot_experts(tokens, routes, gates, *module._kernels()).reshape(x.shape)
      aux = moe.load_balancing_loss(probs, routes)
    else:
      y, stats = module(x)
      aux = stats.aux_loss
    return jnp.sum(y * cotangent) + aux, y

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)), state


def measure(shape: dict, num_tokens: int, repeats: int) -> list[dict]:
  """One row per dispatch at ``num_tokens`` tokens (8 rows of T/8 when T >= 8)."""
  rows = min(8, num_tokens)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(rows, num_tokens // rows, shape["hidden"])), jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  runs, out = {}, []
  for dispatch in ("dense", "sparse", RAGGED):
    step, state = block_step(shape, dispatch)
    compiled = step.lower(state, x, cotangent).compile()
    runs[dispatch] = lambda c=compiled, st=state: jax.block_until_ready(c(st, x, cotangent))
    out.append({"dispatch": dispatch, "flops": float(compiled.cost_analysis()["flops"]),
                "result": runs[dispatch]()})  # also the warm-up call
  seconds = {d: [] for d in runs}
  for _ in range(repeats):
    for dispatch, run in runs.items():
      start = time.perf_counter()
      run()
      seconds[dispatch].append(time.perf_counter() - start)
  ref = out[0]
  for row in out:
    row["seconds"] = statistics.median(seconds[row["dispatch"]])
    diffs = [float(jnp.max(jnp.abs(a - b))) / float(jnp.max(jnp.abs(b)))
             for a, b in zip(jax.tree.leaves(row["result"]), jax.tree.leaves(ref["result"]))]
    row["rel_diff"] = max(diffs)
    row["flop_ratio"] = row["flops"] / ref["flops"]
  for row in out:
    row["time_ratio"] = row["seconds"] / ref["seconds"]
  return out


def table(shape: dict, results: dict) -> str:
  k_over_e = shape["k"] / shape["experts"]
  lines = ["| T | dispatch | MFLOP | FLOPs / dense | k/E | ms (median) | time / dense | "
           "max rel. diff |", "|" + " --- |" * 8]
  for num_tokens, rows in results.items():
    for r in rows:
      lines.append(f"| {num_tokens} | {r['dispatch']} | {r['flops'] / 1e6:.2f} | "
                   f"{r['flop_ratio']:.4f} | {k_over_e:.4f} | {1e3 * r['seconds']:.2f} | "
                   f"{r['time_ratio']:.3f} | {r['rel_diff']:.1e} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tokens", default="2048,64",
                      help="token counts T (B*S) to measure, comma-separated")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--smoke", action="store_true", help="tiny shape, 32 tokens, 2 repeats")
  args = parser.parse_args(argv)
  shape = SMOKE_SHAPE if args.smoke else SHAPE
  tokens = [32] if args.smoke else [int(t) for t in args.tokens.split(",")]
  repeats = 2 if args.smoke else args.repeats
  results = {t: measure(shape, t, repeats) for t in tokens}
  print(f"# MoE block forward + backward, float32, D={shape['hidden']} F={shape['width']} "
        f"E={shape['experts']} k={shape['k']}, {jax.devices()[0].platform}, "
        f"{repeats} interleaved repeats; sparse blocks of "
        + ", ".join(f"{moe.block_rows(t * shape['k'], shape['experts'])} rows at T={t}"
                    for t in tokens))
  print(table(shape, results))


if __name__ == "__main__":
  main()

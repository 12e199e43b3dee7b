"""Attention on packed rows against padded rows at equal real tokens, forward + backward.

Draws ``--sequences`` long-tailed lengths (log-normal, mean about ``--mean_fraction`` of
``--max_len``), lays them out two ways and times the gradient of ``sum(attention(q, k, v) * ct)``
for each ``--backends`` entry in the same process:

- padded: one sequence per row of ``max_len`` slots (a 0/1 mask, the layout of today's update);
- packed: the sequences first-fit-decreasing into rows of ``max_len`` slots (segment ids,
  ``rljax.models.attention``'s module doc).

Prints real tokens per second of each and the ratio packed / padded per backend. On a GPU,
``cudnn`` on packed rows takes its blockwise fallback (cuDNN's API holds one sequence per row),
so ``cudnn`` padded against ``cudnn`` packed is the cuDNN-against-fallback comparison.

  PYTHONPATH=. python benchmarks/packed_attention.py --max_len 1024 --backends blockwise
  PYTHONPATH=. python benchmarks/packed_attention.py --max_len 4096 --backends cudnn,blockwise
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import attention as attn


def long_tailed_lengths(n: int, max_len: int, mean_fraction: float, seed: int) -> np.ndarray:
  """``n`` log-normal lengths (sigma 1) with mean ``mean_fraction * max_len``, in [8, max_len]."""
  sigma = 1.0
  mu = np.log(mean_fraction * max_len) - sigma ** 2 / 2
  lengths = np.random.default_rng(seed).lognormal(mu, sigma, n)
  return np.clip(lengths.astype(int), 8, max_len)


def first_fit_decreasing(lengths, width: int) -> list[list[int]]:
  """Rows of sequence indices whose lengths sum to at most ``width`` (longest placed first)."""
  rows, room = [], []
  for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    fit = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
    if fit is None:
      rows.append([])
      room.append(width)
      fit = len(rows) - 1
    rows[fit].append(i)
    room[fit] -= lengths[i]
  return rows


def padded_segments(lengths, width: int) -> np.ndarray:
  seg = np.zeros((len(lengths), width), np.int32)
  for r, n in enumerate(lengths):
    seg[r, :n] = 1
  return seg


def packed_segments(lengths, width: int) -> np.ndarray:
  rows = first_fit_decreasing(lengths, width)
  seg = np.zeros((len(rows), width), np.int32)
  for r, members in enumerate(rows):
    at = 0
    for sid, i in enumerate(members, start=1):
      seg[r, at:at + lengths[i]] = sid
      at += lengths[i]
  return seg


def time_gradient(backend: str, seg: np.ndarray, heads: int, kv_heads: int, head_dim: int,
                  block: int, dtype, reps: int) -> float:
  """Best-of-``reps`` seconds of one forward + backward of ``attention`` over rows ``seg``."""
  b, t = seg.shape
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (b, t, heads, head_dim), dtype)
  k = jax.random.normal(ks[1], (b, t, kv_heads, head_dim), dtype)
  v = jax.random.normal(ks[2], (b, t, kv_heads, head_dim), dtype)
  ct = jax.random.normal(ks[3], (b, t, heads, head_dim), dtype)
  seg = jnp.asarray(seg)
  loss = lambda q, k, v, s: (attn.attention(q, k, v, s, backend=backend, block=block)
                             .astype(jnp.float32) * ct).sum()
  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  jax.block_until_ready(step(q, k, v, seg))
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(step(q, k, v, seg))
    best = min(best, time.perf_counter() - t0)
  return best


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--max_len", type=int, default=1024)
  p.add_argument("--sequences", type=int, default=32)
  p.add_argument("--mean_fraction", type=float, default=0.25)
  p.add_argument("--backends", default="blockwise")
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--block", type=int, default=attn.DEFAULT_BLOCK)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  lengths = long_tailed_lengths(a.sequences, a.max_len, a.mean_fraction, a.seed)
  layouts = {"padded": padded_segments(lengths, a.max_len),
             "packed": packed_segments(lengths, a.max_len)}
  real = int(lengths.sum())
  print(f"{jax.devices()[0].device_kind}: {a.sequences} sequences, max_len {a.max_len}, "
        f"real tokens {real} (mean {lengths.mean():.0f}), rows padded "
        f"{layouts['padded'].shape[0]} / packed {layouts['packed'].shape[0]} "
        f"(fill {real / layouts['packed'].size:.2f}), heads {a.heads}/{a.kv_heads}x{a.head_dim}, "
        f"{a.dtype}, block {a.block}")
  for backend in a.backends.split(","):
    secs = {name: time_gradient(backend, seg, a.heads, a.kv_heads, a.head_dim, a.block,
                                jnp.dtype(a.dtype), a.reps) for name, seg in layouts.items()}
    print(f"{backend}: forward+backward real tokens/s padded {real / secs['padded']:,.0f}, "
          f"packed {real / secs['packed']:,.0f}: packed / padded x{secs['padded'] / secs['packed']:.2f}")


if __name__ == "__main__":
  main()

"""Gumbel noise for the sampler, bit-identical to ``jax.random.gumbel`` with threefry keys.

Counters are 32-bit: the noise of one call must stay below 2^32 elements (rows x vocab).

On CPU, JAX lowers the threefry hash as a rolled 5-iteration ``while`` loop (to keep compile times
down); inside the decode loop that is two nested loops of tiny ops per generated token. Here the
same hash (Threefry-2x32, 20 rounds, the counter layout of ``jax_threefry_partitionable``) is
written out, so it fuses into one elementwise kernel. The values equal ``jax.random.gumbel(key,
shape)`` (a test checks it), so the statistical guarantees are JAX's, and they do not depend on how
the batch is sharded (the counter is the global element index).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x, d: int):
  return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(k1, k2, x1, x2):
  """The Threefry-2x32 block cipher (20 rounds), elementwise on uint32 arrays."""
  ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
  x1, x2 = x1 + ks[0], x2 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = x1 ^ _rotl(x2, r)
    x1 = x1 + ks[(i + 1) % 3]
    x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x1, x2


def is_threefry(key) -> bool:
  """True for typed threefry keys and raw ``uint32[2]`` (default-implementation) keys."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return "threefry" in str(jax.random.key_impl(key))
  return key.dtype == jnp.uint32 and key.shape[-1:] == (2,)


def key_data(key):
  """uint32[..., 2] words of a threefry key (typed or raw)."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key


def gumbel(key, shape: tuple, offset=0) -> jax.Array:
  """Standard Gumbel noise [shape] float32; ``key`` a threefry key or its uint32[2] words.

  Equals ``jax.random.gumbel(key, full_shape).ravel()[offset:offset + size]``: ``offset`` (an
  int, traced or not) lets a shard draw its own slice of a larger array's noise.
  """
  kd = key_data(key)
  size = int(np.prod(shape))
  lo = jax.lax.iota(jnp.uint32, size).reshape(shape) + jnp.asarray(offset).astype(jnp.uint32)
  return _gumbel_at(kd[0], kd[1], lo)


def gumbel_rows(key_words, rows, vocab: int) -> jax.Array:
  """Gumbel noise [R, vocab] float32, row ``i`` drawn with its own key ``key_words[i]`` (uint32
  [R, 2]) at the counters of row ``rows[i]`` of a [N, vocab] draw: row ``i`` equals
  ``jax.random.gumbel(key_i, (N, vocab))[rows[i]]``. Continuous batching draws each row's token
  ``t`` with ``fold_in(key, t)`` whatever slot and step it runs in."""
  lo = (jnp.asarray(rows).astype(jnp.uint32)[:, None] * np.uint32(vocab)
        + jax.lax.iota(jnp.uint32, vocab)[None, :])
  return _gumbel_at(key_words[:, 0:1], key_words[:, 1:2], lo)


def _gumbel_at(k1, k2, lo):
  """Gumbel noise from the threefry hash of counters ``lo`` (uint32) under key words k1, k2."""
  b1, b2 = threefry2x32(k1, k2, jnp.zeros_like(lo), lo)
  bits = b1 ^ b2
  tiny = np.float32(np.finfo(np.float32).tiny)
  floats = jax.lax.bitcast_convert_type((bits >> np.uint32(9)) | np.uint32(0x3F800000),
                                        jnp.float32) - np.float32(1.0)
  u = jnp.maximum(tiny, floats * (np.float32(1.0) - tiny) + tiny)
  return -jnp.log(-jnp.log(u))

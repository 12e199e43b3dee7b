"""Masked grouped-query attention with one meaning and several backends.

``attention(q, k, v, k_segments, q_offset=..., window=..., backend=...)`` computes

    out[b, s, h] = sum_k softmax_k(q[b, s, h] . k[b, k, h//R] / sqrt(Dh) | allowed) v[b, k, h//R]
    allowed[b, s, k] = seg[b, k] > 0  and  seg[b, k] == qseg[b, s]
                       and  k <= q_offset + s  and  q_offset + s - k < window

**Segments.** ``k_segments`` [B, K] int gives each key slot the sequence it belongs to: 0 is
padding, ``1..n`` are sequences packed into the row as contiguous runs in increasing order
(padding may sit between and after them). A query attends to the keys of its own segment only:
``qseg[b, s]`` is the segment of the last non-padding slot at or before its slot ``q_offset + s``
(``query_segments``: a running maximum, so a valid query's own segment). A 0/1 (or bool) mask is
the one-segment case and means exactly what the key mask always meant, padding queries included.
Causality is *by slot* (query ``s`` sits at slot ``q_offset + s``; keys at slots ``0 .. K-1``),
and Mistral's sliding window (``transformers``' ``kv_idx > q_idx - sliding_window``) applies
when ``window`` is set; both are measured within the row, which within one contiguous segment is
the distance within its sequence, so a packed row attends exactly as its sequences would alone
(their positions restart at 0 in each segment: ``transformer.positions_from_mask``). GQA:
``H = G * R`` query heads share ``G`` key/value heads, and no backend repeats K/V in memory.
Queries with no allowed key (padding) get an unspecified finite output: callers read valid
positions only, and no valid query attends to them.

Backends (``model.attention``):

- ``xla``: the reference. Materialises the ``[B, H, S, K]`` float32 scores (today's formula).
- ``blockwise``: query- and key-chunked online softmax (flash attention, Dao et al. 2022,
  "FlashAttention", Alg. 1 forward / Alg. 2 backward) in pure JAX with a custom VJP: memory
  ``O(S + K)`` per head, forward and backward. Key blocks that no query of a query block may
  see are skipped: outside the causal window, or before the start of the block's first segment
  (forward; in the backward, query blocks after the end of a key block's last segment).
  ``block`` is the largest block: ``S`` and ``K`` are split into near-equal blocks
  (``balanced_block``), so the causal skip works at short lengths too.
- ``cudnn``: ``jax.nn.dot_product_attention`` (cuDNN flash attention; GPUs; float32 inputs are
  cast to bfloat16, the softmax accumulates in float32). Rows
  are rotated so their valid run starts at slot 0, which turns the padding into sequence lengths.
  That API takes one sequence per row, so a batch where some row holds several segments runs
  ``blockwise`` instead (``cudnn_attention``: a runtime ``lax.cond``, exact either way).
- ``pallas``: splash attention (``jax.experimental.pallas.ops.tpu``; TPUs, or interpreted on CPU
  for the tests), the segments as splash's own segment ids.
- ``auto``: cudnn on GPUs (any compute dtype: float32 attends in bfloat16 inputs), pallas on
  TPUs, blockwise elsewhere (``auto_backend``).

``cudnn`` and ``pallas`` apply to self-attention (``q_offset == 0`` and ``S == K``: the training
forward and the sampler's prefill) over rows whose segments are contiguous runs, which is
what every caller passes; queries against a KV cache use ``xla`` up to one block of queries
(decode steps: scores ``[S, K]``, linear in K) and ``blockwise`` beyond.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.errors import StartupError
from rljax.models.config import ATTENTION_BACKENDS as BACKENDS
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
DEFAULT_BLOCK = 128
_SPLASH_BLOCK = 512
_SPLASH_MIN_BLOCK = 128


def resolve_backend(backend: str, *, dtype, self_attention: bool, num_queries: int = 0,
                    block: int = DEFAULT_BLOCK) -> str:
  """The backend that ``attention`` runs for ``backend`` on this platform (see module doc).
  Queries against a cache: up to one block of them materialise their ``[S, K]`` scores (linear
  in K, and the decode step stays one fused einsum), more go blockwise."""
  if backend not in BACKENDS:
    raise ValueError(f"model.attention={backend!r}: expected one of {BACKENDS}")
  if not self_attention:
    return "xla" if backend == "xla" or num_queries <= block else "blockwise"
  if backend != "auto":
    return backend
  return auto_backend(jax.default_backend())


def auto_backend(platform: str) -> str:
  """``model.attention='auto'`` on ``platform``: a fused kernel on accelerators, never the
  pure-JAX blockwise one (2.7-14.6x slower than cuDNN on an H100): cuDNN flash attention on GPUs
  (float32 compute attends in bfloat16 inputs with float32 accumulation, ``cudnn_attention``),
  splash attention on TPUs; blockwise (memory linear in the length) on CPU."""
  return {"gpu": "cudnn", "tpu": "pallas"}.get(platform, "blockwise")


# model.attention values that need one platform (``jax.default_backend()``).
PLATFORM_KERNELS = {"cudnn": "gpu", "pallas": "tpu"}  # pallas elsewhere: interpreted, for tests


def check_platform(backend: str, platform: str | None = None) -> None:
  """Refuse ``model.attention=backend`` where its kernel cannot run (cuDNN off a GPU), in one
  line before anything is built or written."""
  platform = platform or jax.default_backend()
  needs = PLATFORM_KERNELS.get(backend)
  if needs and platform != needs:
    raise StartupError(f"model.attention={backend!r} needs a {needs.upper()}; this process runs "
                       f"JAX on {platform}: use 'auto' ({auto_backend(platform)} here), "
                       "'blockwise' or 'xla'")


def attention(q, k, v, k_segments, *, q_offset=0, window: int | None = None,
              backend: str = "auto", block: int = DEFAULT_BLOCK, aligned: bool = False):
  """Masked GQA attention (module doc). q [B, S, H, Dh]; k, v [B, K, G, Dh]; k_segments [B, K]
  int segment ids (0 padding; a bool / 0-1 key mask is one segment); ``q_offset`` the slot of
  query 0 (int or traced scalar). ``aligned``: every row's first valid slot is 0
  (``aligns_rows``), which spares ``cudnn`` its rotations. Returns [B, S, H, Dh]."""
  chex.assert_rank([q, k, v, k_segments], [4, 4, 4, 2])
  chex.assert_equal_shape([k, v])
  b, s, h, dh = q.shape
  if k.shape[0] != b or k.shape[3] != dh or h % k.shape[2]:
    raise ValueError(f"q {q.shape} and k {k.shape}: need k [B={b}, K, G, Dh={dh}], H % G == 0")
  chex.assert_shape(k_segments, (b, k.shape[1]))
  if window is not None and window < 1:
    raise ValueError(f"sliding window must be >= 1 (or None), got {window}")
  self_attention = isinstance(q_offset, int) and q_offset == 0 and s == k.shape[1]
  kind = resolve_backend(backend, dtype=q.dtype, self_attention=self_attention,
                        num_queries=s, block=block)
  segments = as_segments(k_segments)
  if kind == "xla":
    return reference_attention(q, k, v, segments, q_offset=q_offset, window=window)
  if kind == "blockwise":
    return blockwise_attention(q, k, v, segments, q_offset, window=window, block=block)
  if kind == "cudnn":
    return cudnn_attention(q, k, v, segments, window=window, aligned=aligned, block=block)
  return splash_attention(q, k, v, segments, window=window)


def as_segments(k_segments):
  """int32 segment ids [B, K] from segment ids or a bool / 0-1 key mask (one segment)."""
  return jnp.asarray(k_segments).astype(jnp.int32)


def query_segments(k_segments, q_offset, num_queries: int):
  """[B, S] int32: the segment of queries at slots ``q_offset ..`` = the running maximum of the
  key segments up to each slot (module doc: a valid slot's own segment; a padding slot belongs
  to the segment before it, 0 before the first)."""
  running = jax.lax.cummax(k_segments, axis=1)
  return jax.lax.dynamic_slice_in_dim(running, q_offset, num_queries, axis=1)


def allowed_mask(k_segments, q_segments, q_slots, k_slots, window):
  """allowed [B, Sq, Kb] from k_segments [B, Kb], q_segments [B, Sq], q_slots [Sq], k_slots
  [Kb] (module doc)."""
  ok = k_slots[None, :] <= q_slots[:, None]
  if window is not None:
    ok = ok & (q_slots[:, None] - k_slots[None, :] < window)
  same = (k_segments[:, None, :] == q_segments[:, :, None]) & (k_segments > 0)[:, None, :]
  return ok[None] & same


def reference_attention(q, k, v, k_segments, *, q_offset=0, window=None):
  """The materialised formula: ``[B, G, R, S, K]`` float32 scores, masked, softmax in float32."""
  b, s, h, dh = q.shape
  g = k.shape[2]
  segments = as_segments(k_segments)
  allowed = allowed_mask(segments, query_segments(segments, q_offset, s), q_offset + jnp.arange(s),
                         jnp.arange(k.shape[1]), window)
  q = q.reshape(b, s, g, h // g, dh)
  scores = jnp.einsum("bsgrd,bkgd->bgrsk", q, k.astype(q.dtype)).astype(jnp.float32)
  scores = scores / np.float32(math.sqrt(dh))
  scores = jnp.where(allowed[:, None, None], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum("bgrsk,bkgd->bsgrd", probs, v).reshape(b, s, h, dh)


# --- blockwise (flash) attention in pure JAX ----------------------------------------------------
#
# The kernel works on any evenly spaced slots: query i of a call sits at slot ``q0 + stride * i``
# and key j at ``k0 + stride * j`` of the row (stride 1 here; the striped layout of context
# parallelism, ``rljax.parallel.ring``, calls it with stride N on each device's every N-th slot).
# Causality, the window and the segments are decided by slot, so one device's piece of a ring
# step is the same kernel with other numbers.

class Rows(NamedTuple):
  """What the blockwise kernel reads of the rows besides q, k, v, all int32: the segment of each
  query ``q_seg`` [B, Sq] and key ``k_seg`` [B, K] (``query_segments``; 0 padding), the first
  slot a query's segment may see ``q_start`` [B, Sq] and the last slot of a query that may see a
  key ``k_end`` [B, K] (``segment_spans``: the kernel's block skipping)."""
  q_seg: jax.Array
  k_seg: jax.Array
  q_start: jax.Array
  k_end: jax.Array

  def padded(self, sq: int, kn: int) -> "Rows":
    """Padded to ``sq`` queries and ``kn`` keys: padding keys have segment 0 and no query that
    sees them; a padding query segment 0 and the last query's start (no block range changes)."""
    pad = lambda x, n, **kw: jnp.pad(x, ((0, 0), (0, n - x.shape[1])), **kw)
    return Rows(pad(self.q_seg, sq), pad(self.k_seg, kn), pad(self.q_start, sq, mode="edge"),
                pad(self.k_end, kn, constant_values=-1))


def row_spans(k_segments, q_offset, num_queries: int) -> Rows:
  """``Rows`` of queries at slots ``q_offset .. q_offset + num_queries - 1`` against the keys of
  ``k_segments`` [B, K] at slots ``0 .. K-1``."""
  start, end = segment_spans(k_segments)
  return Rows(query_segments(k_segments, q_offset, num_queries), k_segments,
              jax.lax.dynamic_slice_in_dim(start, q_offset, num_queries, axis=1), end)


def _ceil_div(a, n: int):
  return -((-a) // n)


def _key_block_range(q_first, q_last, k0, stride: int, bk, nk, window, seg_start):
  """Key blocks ``[lo, hi)`` holding a key some query in slots ``q_first..q_last`` may see (key
  j at slot ``k0 + stride * j``); ``seg_start``: the first slot of any of their segments."""
  lo_slot = seg_start if window is None else jnp.maximum(seg_start, q_first - window + 1)
  lo = _ceil_div(lo_slot - k0, stride) // bk
  hi = (q_last - k0) // stride // bk + 1
  return jnp.clip(lo, 0, nk), jnp.clip(hi, 0, nk)


def _query_block_range(k_first, k_last, q0, stride: int, bq, nq, window, seg_end):
  """Query blocks ``[lo, hi)`` holding a query that may see a key in slots ``k_first..k_last``
  (query i at slot ``q0 + stride * i``); ``seg_end``: the last query slot of their segments."""
  hi_slot = seg_end if window is None else jnp.minimum(seg_end, k_last + window - 1)
  lo = _ceil_div(k_first - q0, stride) // bq
  hi = (hi_slot - q0) // stride // bq + 1
  return jnp.clip(lo, 0, nq), jnp.clip(hi, 0, nq)


def segment_spans(k_segments):
  """(start, end) [B, K] int32: the first and the last slot whose query segment
  (``query_segments``) is slot t's, i.e. from the first token of t's segment to the slot before
  the next segment starts (``K - 1`` after the last); ``start`` is t itself before the first
  segment. The keys a query at slot t may see lie in ``[start[t], t]``, and the queries that may
  see a key at slot t in ``[t, end[t]]``: the blockwise kernel's segment skipping."""
  n = k_segments.shape[1]
  slots = jnp.arange(n, dtype=jnp.int32)
  running = jax.lax.cummax(k_segments, axis=1)
  before = jnp.pad(running[:, :-1], ((0, 0), (1, 0)))
  is_start = (k_segments > 0) & (k_segments != before)
  start = jnp.where(running > 0, jax.lax.cummax(jnp.where(is_start, slots, 0), axis=1), slots)
  next_start = jax.lax.cummin(jnp.where(is_start, slots, n), axis=1, reverse=True)
  end = jnp.pad(next_start[:, 1:], ((0, 0), (0, 1)), constant_values=n) - 1
  return start, end


def _scores(qb, kb, scale):
  """[B, G, bq*R, Dh] x [B, G, bk, Dh] -> float32 scores [B, G, bq*R, bk]."""
  s = jnp.einsum("bgqd,bgkd->bgqk", qb, kb.astype(qb.dtype), preferred_element_type=jnp.float32)
  return s / scale


def _block_ok(rows: Rows, q0, k0, stride: int, i, kj, bq, bk, r, window):
  """allowed of query block ``i`` and the key block starting at key ``kj`` as [B, 1, bq*R, bk]
  (query rows are slot-major, head-minor)."""
  ok = allowed_mask(jax.lax.dynamic_slice_in_dim(rows.k_seg, kj, bk, 1),
                    jax.lax.dynamic_slice_in_dim(rows.q_seg, i * bq, bq, 1),
                    q0 + stride * (i * bq + jnp.arange(bq)), k0 + stride * (kj + jnp.arange(bk)),
                    window)
  return jnp.repeat(ok, r, axis=1)[:, None]


def balanced_block(n: int, block: int) -> int:
  """The block size that splits ``n`` into ``ceil(n / block)`` near-equal blocks: at most
  ``block``, and padding of less than one block in all (``n=264, block=128``: 3 blocks of 88,
  where blocks of 128 would pad to 384)."""
  return -(-n // -(-n // block))


def head_major(q, k, v, block):
  """Head-major, block-padded operands: q [B, G, Sp*R, Dh], k, v [B, G, Kp, Dh], and the
  blocks ``bq``, ``bk``."""
  b, s, h, dh = q.shape
  kn, g = k.shape[1], k.shape[2]
  bq, bk = balanced_block(s, block), balanced_block(kn, block)
  sp, kp = -(-s // bq) * bq, -(-kn // bk) * bk
  qh = jnp.pad(q, ((0, 0), (0, sp - s), (0, 0), (0, 0))).reshape(b, sp, g, h // g, dh)
  qh = qh.transpose(0, 2, 1, 3, 4).reshape(b, g, sp * (h // g), dh)
  kv_pad = ((0, 0), (0, kp - kn), (0, 0), (0, 0))
  kh = jnp.pad(k, kv_pad).transpose(0, 2, 1, 3)
  vh = jnp.pad(v, kv_pad).transpose(0, 2, 1, 3)
  return qh, kh, vh, bq, bk


def token_major(x, b, s, h, dh, g):
  """[B, G, Sp*R, Dh] -> [B, S, H, Dh]."""
  x = x.reshape(b, g, -1, h // g, dh).transpose(0, 2, 1, 3, 4)
  return x[:, :s].reshape(b, s, h, dh)


def blockwise_attention(q, k, v, k_segments, q_offset=0, *, window=None, block=DEFAULT_BLOCK):
  """``reference_attention`` by blocks of ``block`` queries x ``block`` keys, never ``S x K``."""
  b, s, h, dh = q.shape
  g = k.shape[2]
  q_offset = jnp.asarray(q_offset, jnp.int32)
  qh, kh, vh, bq, bk = head_major(q, k, v, block)
  rows = row_spans(as_segments(k_segments), q_offset, s).padded(qh.shape[2] // (h // g),
                                                                kh.shape[2])
  out = _flash(qh, kh, vh, rows, q_offset, jnp.zeros((), jnp.int32), 1, bq, bk, h // g, window)
  return token_major(out, b, s, h, dh, g)


def flash_forward(q, k, v, rows: Rows, q0, k0, stride: int, bq, bk, r, window, out_dtype=None):
  """Online-softmax forward of head-major q [B, G, Sp*R, Dh] against k, v [B, G, Kp, Dh]
  (queries at slots ``q0 + stride * i``, keys at ``k0 + stride * j``): (out [B, G, Sp*R, Dh] in
  ``out_dtype`` (q's), lse [B, G, Sp*R] float32: the log-sum-exp of each query's scores,
  ``MASK_VALUE`` where it sees no key (its out is then 0))."""
  b, g, n_rows, dh = q.shape
  nq, nk = n_rows // (bq * r), k.shape[2] // bk
  scale = np.float32(math.sqrt(dh))

  def query_block(i, carry):
    out, lse = carry
    qb = jax.lax.dynamic_slice_in_dim(q, i * bq * r, bq * r, 2)
    q_first = q0 + stride * i * bq
    seg_start = jnp.min(jax.lax.dynamic_slice_in_dim(rows.q_start, i * bq, bq, 1))
    lo, hi = _key_block_range(q_first, q_first + stride * (bq - 1), k0, stride, bk, nk, window,
                              seg_start)

    def key_block(j, acc):
      o, m, l = acc
      s = _scores(qb, jax.lax.dynamic_slice_in_dim(k, j * bk, bk, 2), scale)
      ok = _block_ok(rows, q0, k0, stride, i, j * bk, bq, bk, r, window)
      s = jnp.where(ok, s, MASK_VALUE)
      m_new = jnp.maximum(m, s.max(-1))
      p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
      alpha = jnp.exp(m - m_new)
      vb = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, 2)
      pv = jnp.einsum("bgqk,bgkd->bgqd", p.astype(v.dtype), vb, preferred_element_type=jnp.float32)
      return o * alpha[..., None] + pv, m_new, l * alpha + p.sum(-1)

    rows_b = (b, g, bq * r)
    init = (jnp.zeros(rows_b + (dh,), jnp.float32), jnp.full(rows_b, MASK_VALUE, jnp.float32),
            jnp.zeros(rows_b, jnp.float32))
    o, m, l = jax.lax.fori_loop(lo, hi, key_block, init)
    seen = l > 0
    o = o / jnp.where(seen, l, 1.0)[..., None]
    block_lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), MASK_VALUE)
    out = jax.lax.dynamic_update_slice_in_dim(out, o.astype(out.dtype), i * bq * r, 2)
    return out, jax.lax.dynamic_update_slice_in_dim(lse, block_lse, i * bq * r, 2)

  init = (jnp.zeros(q.shape, out_dtype or q.dtype), jnp.zeros((b, g, n_rows), jnp.float32))
  return jax.lax.fori_loop(0, nq, query_block, init)


def flash_backward(q, k, v, rows: Rows, q0, k0, stride: int, lse, delta, dout, bq, bk, r,
                   window):
  """FlashAttention-2 backward of ``flash_forward``'s slots: per key block, recompute
  ``P = exp(S - lse)`` for the query blocks that see it; ``dV += P^T dO``,
  ``dS = P (dO V^T - delta)``, ``dK += dS^T Q``, ``dQ += dS K`` (with the 1/sqrt(Dh) scale).
  ``lse`` and ``delta = rowsum(dO * O)`` [B, G, Sp*R] are the whole softmax's, so a piece of
  the keys (a ring step) gets its exact share. Returns float32 (dq, dk, dv)."""
  b, g, n_rows, dh = q.shape
  nq, nk = n_rows // (bq * r), k.shape[2] // bk
  scale = np.float32(math.sqrt(dh))

  def key_block(j, carry):
    dq, dk, dv = carry
    kj = j * bk
    kb = jax.lax.dynamic_slice_in_dim(k, kj, bk, 2)
    vb = jax.lax.dynamic_slice_in_dim(v, kj, bk, 2)
    k_first = k0 + stride * kj
    seg_end = jnp.max(jax.lax.dynamic_slice_in_dim(rows.k_end, kj, bk, 1))
    lo, hi = _query_block_range(k_first, k_first + stride * (bk - 1), q0, stride, bq, nq,
                                window, seg_end)

    def query_block(i, acc):
      dq, dkb, dvb = acc
      sl = lambda x: jax.lax.dynamic_slice_in_dim(x, i * bq * r, bq * r, 2)
      qb, dob = sl(q), sl(dout)
      ok = _block_ok(rows, q0, k0, stride, i, kj, bq, bk, r, window)
      p = jnp.where(ok, jnp.exp(_scores(qb, kb, scale) - sl(lse)[..., None]), 0.0)
      dvb = dvb + jnp.einsum("bgqk,bgqd->bgkd", p.astype(dob.dtype), dob,
                             preferred_element_type=jnp.float32)
      dp = jnp.einsum("bgqd,bgkd->bgqk", dob, vb.astype(dob.dtype),
                      preferred_element_type=jnp.float32)
      ds = (p * (dp - sl(delta)[..., None]) / scale)
      dkb = dkb + jnp.einsum("bgqk,bgqd->bgkd", ds.astype(qb.dtype), qb,
                             preferred_element_type=jnp.float32)
      dqb = sl(dq) + jnp.einsum("bgqk,bgkd->bgqd", ds.astype(kb.dtype), kb,
                                preferred_element_type=jnp.float32)
      return jax.lax.dynamic_update_slice_in_dim(dq, dqb, i * bq * r, 2), dkb, dvb

    zeros = jnp.zeros((b, g, bk, dh), jnp.float32)
    dq, dkb, dvb = jax.lax.fori_loop(lo, hi, query_block, (dq, zeros, zeros))
    dk = jax.lax.dynamic_update_slice_in_dim(dk, dkb, kj, 2)
    return dq, dk, jax.lax.dynamic_update_slice_in_dim(dv, dvb, kj, 2)

  init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32),
          jnp.zeros(v.shape, jnp.float32))
  return jax.lax.fori_loop(0, nk, key_block, init)


def softmax_delta(out, dout):
  """``rowsum(dO * O)`` [B, G, Sp*R] float32: the backward's correction for the softmax."""
  return jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _flash(q, k, v, rows, q0, k0, stride, bq, bk, r, window):
  return flash_forward(q, k, v, rows, q0, k0, stride, bq, bk, r, window)[0]


def _flash_fwd(q, k, v, rows, q0, k0, stride, bq, bk, r, window):
  out, lse = flash_forward(q, k, v, rows, q0, k0, stride, bq, bk, r, window)
  return out, (q, k, v, rows, q0, k0, out, lse)


def _flash_bwd(stride, bq, bk, r, window, res, dout):
  q, k, v, rows, q0, k0, out, lse = res
  dq, dk, dv = flash_backward(q, k, v, rows, q0, k0, stride, lse, softmax_delta(out, dout), dout,
                              bq, bk, r, window)
  no_grad = jax.tree.map(lambda _: None, rows)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), no_grad, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# --- platform kernels ---------------------------------------------------------------------------

def rotate_rows(x, shift):
  """Row ``b`` of x [B, T, ...] rotated left by ``shift[b]`` slots (slot t takes t + shift)."""
  idx = (jnp.arange(x.shape[1])[None, :] + shift[:, None]) % x.shape[1]
  return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def first_valid(k_segments):
  """[B] int32: each row's first valid slot, where its first segment starts (0 for a row with
  none). Rotating a row left by it (``rotate_rows``) keeps the order of its segments and the
  distances within them: its leading padding moves to the end."""
  return jnp.argmax(as_segments(k_segments) > 0, axis=1).astype(jnp.int32)


def aligns_rows(backend: str, dtype) -> bool:
  """Whether a self-attention forward with ``backend`` should rotate its rows once so that every
  valid run starts at slot 0 (``attention(..., aligned=True)``): cuDNN takes padding only as
  sequence lengths from slot 0, and rotating q, k, v and the output in every layer instead costs
  four gathers (and four scatters in the backward) per layer."""
  return resolve_backend(backend, dtype=dtype, self_attention=True) == "cudnn"


def several_segments(k_segments):
  """Scalar bool: some row holds more than one segment (a packed row)."""
  segments = as_segments(k_segments)
  lowest = jnp.where(segments > 0, segments, jnp.iinfo(jnp.int32).max).min(axis=1)
  return jnp.any(segments.max(axis=1) > lowest)


def cudnn_attention(q, k, v, k_segments, *, window=None, implementation: str | None = "cudnn",
                    aligned: bool = False, block: int = DEFAULT_BLOCK):
  """Self-attention through ``jax.nn.dot_product_attention``. Each row's valid run is rotated to
  start at slot 0 (unless ``aligned``: it does already), so padding becomes
  ``key/query_seq_lengths`` and causality by slot is ``is_causal`` (rotation keeps the order of
  the run; RoPE was applied before, by position). The valid runs must be contiguous.
  That API holds one sequence per row (one ``query/key_value_seq_lengths`` entry; the packed
  layout of cuDNN's own entry point, ``q_offsets``/``kv_offsets``, is private to JAX): a batch
  where some row holds several segments (``several_segments``, decided at run time by
  ``lax.cond``) runs ``blockwise_attention`` with ``block`` instead, exact on any layout.
  ``implementation='xla'`` runs the same masking on any platform (tests)."""
  segments = as_segments(k_segments)
  dtype = q.dtype

  def one_segment(q, k, v, segments):
    valid = segments > 0
    first = jnp.zeros(valid.shape[:1], jnp.int32) if aligned else first_valid(valid)
    n_valid = valid.sum(axis=1).astype(jnp.int32)
    if implementation == "cudnn" and q.dtype not in (jnp.bfloat16, jnp.float16):
      # cuDNN's kernel takes 16-bit inputs only; it accumulates the softmax in float32.
      q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    if not aligned:
      q, k, v = (rotate_rows(x, first) for x in (q, k, v))
    out = jax.nn.dot_product_attention(
        q, k, v, is_causal=True, query_seq_lengths=n_valid, key_value_seq_lengths=n_valid,
        local_window_size=None if window is None else (window - 1, 0),
        implementation=implementation)
    if not aligned:
      out = rotate_rows(out, -first)
    return out.astype(dtype)

  def packed(q, k, v, segments):
    return blockwise_attention(q, k, v, segments, window=window, block=block).astype(dtype)

  return jax.lax.cond(several_segments(segments), packed, one_segment, q, k, v, segments)


def splash_attention(q, k, v, k_segments, *, window=None, interpret: bool | None = None):
  """Self-attention through Pallas splash attention (MQA kernel vmapped over the ``G`` key/value
  heads and the batch; the segments, padding included as segment 0, as splash's segment ids of
  queries and keys alike: a valid query sees its own segment). ``interpret`` defaults to "not on
  a TPU"."""
  # The TPU kernels (Mosaic): imported only where they run.
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  b, s, h, dh = q.shape
  g = k.shape[2]
  r = h // g
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  blk = _SPLASH_BLOCK if s >= _SPLASH_BLOCK else _SPLASH_MIN_BLOCK
  sp = -(-s // blk) * blk
  pad = ((0, 0), (0, sp - s), (0, 0), (0, 0))
  seg = jnp.pad(as_segments(k_segments), ((0, 0), (0, sp - s)))
  mask = sm.CausalMask((sp, sp)) if window is None else sm.LocalMask(
      (sp, sp), window_size=(window - 1, 0), offset=0)
  sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                        block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
  kernel = sk.make_splash_mqa_single_device(sm.MultiHeadMask([mask] * r), block_sizes=sizes,
                                            interpret=interpret)
  # [B, G, R, Sp, Dh] queries (pre-scaled: splash has no softmax scale), [B, G, Sp, Dh] keys.
  qh = (jnp.pad(q, pad) / np.asarray(math.sqrt(dh), q.dtype)).reshape(b, sp, g, r, dh)
  qh = qh.transpose(0, 2, 3, 1, 4)
  kh, vh = (jnp.pad(x, pad).transpose(0, 2, 1, 3) for x in (k, v))
  per_head = jax.vmap(kernel, in_axes=(0, 0, 0, None))
  per_row = jax.vmap(lambda q_, k_, v_, sg: per_head(q_, k_, v_, sk.SegmentIds(q=sg, kv=sg)))
  out = per_row(qh, kh, vh, seg)  # [B, G, R, Sp, Dh]
  return out.transpose(0, 3, 1, 2, 4)[:, :s].reshape(b, s, h, dh)

"""Ring attention over one mesh axis, for rows striped over its N devices (``rljax.parallel.
context``: device c holds slots ``c, c+N, c+2N, ..`` of every row). Everything here runs inside a
``shard_map`` manual over the axis and names the axis only.

**Ring attention** (Liu et al. 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", arXiv 2310.01889): each device keeps its queries and passes its keys and
values around the ring (``ppermute``); each of the N steps is ``attention.flash_forward`` on the
local queries and the visiting keys, at their slots (stride N: the blockwise kernel's block
skipping, causality, windows and segments all hold), and the pieces are combined by their
log-sum-exp (FlashAttention's identity, exact). The backward (a custom VJP) passes the keys and
values around again with their gradient accumulators, which come home after N steps: memory
stays ``O(S/N)`` per device both ways. Striped rows give every device the same work at every
step (Brandon et al. 2023, "Striped Attention", arXiv 2311.09431): with contiguous pieces under a
causal mask the device holding the first piece sees no key at N-1 of the N steps.

**Decode** (``cache_attend_at``): the sampler's KV cache is striped the same way (slot j on
device ``j mod N`` at local slot ``j div N``), so no device holds a row's whole cache. A prefill
feeds each device its stripe of the prompt and runs the ring; a decode step writes the new
token's key and value on the device that owns its slot, every device attends to its own slots,
and the partial outputs are combined by log-sum-exp across the axis (all-gathered and combined
in device order, so every device gets the same bits and samples the same token).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import attention as attention_lib
from rljax.models.config import ModelConfig


def stripe(x, c, n: int):
  """Device ``c``'s slots ``c, c+N, ..`` of x [B, S, ...] (S a multiple of n; c may be traced)."""
  b, s = x.shape[:2]
  x = x.reshape((b, s // n, n) + x.shape[2:])
  return jax.lax.dynamic_index_in_dim(x, c, axis=2, keepdims=False)


def gather_stripes(x, axis: str, n: int):
  """Every device's stripe [B, S/N, ...] of the axis put together: [B, S, ...] on each."""
  parts = jax.lax.all_gather(x, axis)  # [N, B, S/N, ...]
  return jnp.moveaxis(parts, 0, 2).reshape(x.shape[:1] + (n * x.shape[1],) + x.shape[2:])


def from_device(x, src, axis: str):
  """Device ``src``'s x on every device of the axis (exact: the others add zeros)."""
  mine = jax.lax.axis_index(axis) == src
  return jax.lax.psum(jnp.where(mine, x, jnp.zeros_like(x)), axis)


def global_rows(segments) -> attention_lib.Rows:
  """The kernel's ``Rows`` of self-attention over rows of segment ids [B, S] (slot numbers of the
  whole row; fold or ``stripe`` them for the devices)."""
  return attention_lib.row_spans(attention_lib.as_segments(segments), 0, segments.shape[1])


# --- ring attention --------------------------------------------------------------------------------

def ring_attention(q, k, v, rows: attention_lib.Rows, *, axis: str, n: int, window=None,
                   block: int = attention_lib.DEFAULT_BLOCK):
  """Causal attention of this device's queries against the keys of all N devices of ``axis``.

  q [B, Sq, H, Dh]: the last Sq of the device's ``Sl`` stripe slots (Sq = Sl, or 1 for the last
  position of a prefill); k, v [B, Sl, G, Dh]: its stripe's keys. ``rows``: the stripe's
  ``Rows`` (queries: the last Sq; keys: all Sl) in slot numbers of the whole row. Returns
  [B, Sq, H, Dh] in q's dtype."""
  b, sq, h, dh = q.shape
  sl, g = k.shape[1], k.shape[2]
  qh, kh, vh, bq, bk = attention_lib.head_major(q, k, v, block)
  rows = rows.padded(qh.shape[2] // (h // g), kh.shape[2])
  out = _ring(qh, kh, vh, rows, axis, n, sl - sq, bq, bk, h // g, window)
  return attention_lib.token_major(out, b, sq, h, dh, g)


def _neighbour(x, axis: str, n: int):
  """x sent one device along the ring (device c gets device c-1's)."""
  return jax.lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])


def _ring_forward(qh, kh, vh, rows, axis, n, q_first, bq, bk, r, window):
  """(out float32, lse) of the local queries over all devices' keys, step s on device c using
  the keys of device ``c - s`` (they arrive one neighbour per step)."""
  c = jax.lax.axis_index(axis)
  q0 = c + n * q_first

  def piece(s, kh, vh, k_seg, k_end):
    return attention_lib.flash_forward(qh, kh, vh, rows._replace(k_seg=k_seg, k_end=k_end), q0,
                                       (c - s) % n, n, bq, bk, r, window, jnp.float32)

  out, lse = piece(0, kh, vh, rows.k_seg, rows.k_end)

  def step(s, carry):
    out, lse, keys = carry
    keys = jax.tree.map(lambda x: _neighbour(x, axis, n), keys)
    o, l = piece(s, *keys)
    new = jnp.logaddexp(lse, l)
    out = out * jnp.exp(lse - new)[..., None] + o * jnp.exp(l - new)[..., None]
    return out, new, keys

  out, lse, _ = jax.lax.fori_loop(1, n, step, (out, lse, (kh, vh, rows.k_seg, rows.k_end)))
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9, 10))
def _ring(qh, kh, vh, rows, axis, n, q_first, bq, bk, r, window):
  out, _ = _ring_forward(qh, kh, vh, rows, axis, n, q_first, bq, bk, r, window)
  return out.astype(qh.dtype)


def _ring_fwd(qh, kh, vh, rows, axis, n, q_first, bq, bk, r, window):
  out, lse = _ring_forward(qh, kh, vh, rows, axis, n, q_first, bq, bk, r, window)
  out = out.astype(qh.dtype)
  return out, (qh, kh, vh, rows, out, lse)


def _ring_bwd(axis, n, q_first, bq, bk, r, window, res, dout):
  """Each step: the visiting keys' share of dq, and their dk, dv added to the accumulators that
  travel with them; after N steps the accumulators are back on the keys' own device."""
  qh, kh, vh, rows, out, lse = res
  c = jax.lax.axis_index(axis)
  q0 = c + n * q_first
  delta = attention_lib.softmax_delta(out, dout)

  def step(s, carry):
    dq, keys = carry
    kh, vh, k_seg, k_end, dk, dv = keys
    dq_s, dk_s, dv_s = attention_lib.flash_backward(
        qh, kh, vh, rows._replace(k_seg=k_seg, k_end=k_end), q0, (c - s) % n, n, lse, delta,
        dout, bq, bk, r, window)
    keys = (kh, vh, k_seg, k_end, dk + dk_s, dv + dv_s)
    return dq + dq_s, jax.tree.map(lambda x: _neighbour(x, axis, n), keys)

  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
  dq, keys = jax.lax.fori_loop(
      0, n, step, (zeros(qh), (kh, vh, rows.k_seg, rows.k_end, zeros(kh), zeros(vh))))
  dk, dv = keys[4], keys[5]
  return (dq.astype(qh.dtype), dk.astype(kh.dtype), dv.astype(vh.dtype),
          jax.tree.map(lambda _: None, rows))


_ring.defvjp(_ring_fwd, _ring_bwd)


# --- the sampler's striped KV cache --------------------------------------------------------------

def cache_attend_at(cfg: ModelConfig, slot, kv_valid, s: int, axis: str, n: int):
  """The strategy of a forward through the striped cache: local cache ``(k, v)`` [B, G, K/N, Dh]
  holds slots ``c + N*j``. ``kv_valid`` [B, K]: the slots a query may attend to (all of the
  row's, the same on every device).

  ``slot`` the static 0: a prefill; the ``s`` tokens fed are the device's stripe of a prompt of
  ``N*s`` slots, written at local slots ``0 .. s-1``, attending by the ring. Otherwise a decode
  step (s = 1): the token at slot ``slot`` is written by device ``slot mod N`` at its local
  slot ``slot div N``, and every device's partial attention over its own slots is combined
  (``combine_partials``). Inside a ``shard_map`` manual over ``axis`` (N = ``n`` devices)."""
  c = jax.lax.axis_index(axis)
  if isinstance(slot, int) and slot == 0:
    rows = jax.tree.map(lambda x: stripe(x, c, n), global_rows(kv_valid[:, :n * s]))

    def prefill(q, k, v, layer_cache, window):
      ck, cv = layer_cache
      ck = jax.lax.dynamic_update_slice(ck, k.transpose(0, 2, 1, 3).astype(ck.dtype), (0, 0, 0, 0))
      cv = jax.lax.dynamic_update_slice(cv, v.transpose(0, 2, 1, 3).astype(cv.dtype), (0, 0, 0, 0))
      sq = q.shape[1]
      mine = rows._replace(q_seg=rows.q_seg[:, s - sq:], q_start=rows.q_start[:, s - sq:])
      out = ring_attention(q, k.astype(q.dtype), v.astype(q.dtype), mine, axis=axis, n=n,
                           window=window, block=cfg.attention_block)
      return out, (ck, cv)
    return prefill
  if s != 1:
    raise ValueError(f"the striped cache decodes one token per step, got {s}")
  owner, local = slot % n, slot // n

  def decode(q, k, v, layer_cache, window):
    ck, cv = layer_cache
    ck, cv = (_write_owned(cache, x, local, c == owner) for cache, x in ((ck, k), (cv, v)))
    k_slots = c + n * jnp.arange(ck.shape[2])
    ok = k_slots <= slot
    if window is not None:
      ok = ok & (slot - k_slots < window)
    allowed = (ok[None] & stripe(kv_valid[:, :n * ck.shape[2]], c, n))[:, None, None, None]
    o, lse = partial_cache_attention(q, ck, cv, allowed)
    return combine_partials(o, lse, axis).astype(q.dtype), (ck, cv)
  return decode


def _write_owned(cache, x, local, owned):
  """x [B, 1, G, Dh] written at local slot ``local`` of cache [B, G, Kl, Dh] where ``owned``
  (elsewhere the slot keeps its value: one slot is read and written, not the cache)."""
  x = x.transpose(0, 2, 1, 3).astype(cache.dtype)
  old = jax.lax.dynamic_slice_in_dim(cache, local, 1, axis=2)
  return jax.lax.dynamic_update_slice_in_dim(cache, jnp.where(owned, x, old), local, axis=2)


def partial_cache_attention(q, ck, cv, allowed):
  """``kv_cache.cache_attention`` over a device's slots, unnormalised across devices: (o [B, Sq,
  H, Dh] float32, normalised over these slots; lse [B, Sq, H] float32, ``MASK_VALUE`` where
  none is allowed)."""
  b, sq, h, dh = q.shape
  g, k_slots = ck.shape[1], ck.shape[2]
  r = h // g
  qh = q.reshape(b, sq, g, r, dh).transpose(0, 2, 3, 1, 4).reshape(b, g, r * sq, dh)
  scores = jnp.einsum("bgqd,bgkd->bgqk", qh, ck.astype(q.dtype),
                      preferred_element_type=jnp.float32)
  scores = scores.reshape(b, g, r, sq, k_slots) / np.float32(math.sqrt(dh))
  scores = jnp.where(allowed, scores, attention_lib.MASK_VALUE)
  m = scores.max(-1, keepdims=True)
  p = jnp.where(allowed, jnp.exp(scores - m), 0.0)
  l = p.sum(-1)
  seen = l > 0
  probs = (p / jnp.where(seen, l, 1.0)[..., None]).reshape(b, g, r * sq, k_slots)
  o = jnp.einsum("bgqk,bgkd->bgqd", probs.astype(cv.dtype), cv,
                 preferred_element_type=jnp.float32).reshape(b, g, r, sq, dh)
  lse = jnp.where(seen, m[..., 0] + jnp.log(jnp.where(seen, l, 1.0)), attention_lib.MASK_VALUE)
  return (o.transpose(0, 3, 1, 2, 4).reshape(b, sq, h, dh),
          lse.transpose(0, 3, 1, 2).reshape(b, sq, h))


def combine_partials(o, lse, axis: str):
  """Softmax pieces of every device of ``axis`` as one: ``out = sum_c exp(lse_c - lse) o_c``
  with ``lse = logsumexp_c lse_c``, from the all-gathered pieces summed in device order (the
  same bits on every device)."""
  os_, lses = jax.lax.all_gather(o, axis), jax.lax.all_gather(lse, axis)
  total = jax.nn.logsumexp(lses, axis=0)
  weights = jnp.exp(lses - total[None])
  out = weights[0][..., None] * os_[0]
  for part in range(1, os_.shape[0]):
    out = out + weights[part][..., None] * os_[part]
  return out

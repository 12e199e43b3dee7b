"""Continuous batching across turns, the compiled half: a KV-cache *store* whose rows outlive a
turn, so an episode that waits for its environment keeps its cache and re-enters where it left.

The turn-synchronous driver (``rljax.envs.rollout``) re-prefills every row's whole trajectory at
each turn and waits for its slowest row and its slowest tool. Here every episode owns one row of
a device-resident store, per layer ``(k, v)`` [M, G, L, Dh], holding the keys and values of its
trajectory so far (prompt, turns, observations) as one contiguous run from index 0, so that a
token's cache index is its position (the turn-synchronous driver's ``cumsum(mask) - 1`` of the
left-padded sequence). Nothing in it is ever recomputed:

``run_lanes``: ``W`` lanes, each bound to one store row, first feed their new ids (an entering
row's prompt, or its last sampled token and the observation; a decoding lane's last drawn token)
at the indices after those the row holds, attending causally to all before them, then decode
one token per step until ``steps`` tokens were drawn, or ``want`` lanes ended their segment (a
stop id or the segment's budget: the host has rows waiting to take their place), or no lane is
left. The call gathers its rows of the store once, runs, and scatters back the indices it wrote
(the store is donated, so the scatter is in place): a host round trip costs a copy of the rows it
touches, not one per step, and admitting rows costs no call of its own.

Which rows run together, and when, never changes a row's tokens: token ``t`` of a row's
segment ``s`` (its ``s``-th sampler segment, see ``rljax.envs.continuous``) is drawn with
``fold_in(fold_in(key, s), t)`` at the noise counters of the row's index in the batch.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.models import kv_cache, transformer
from rljax.models.config import ModelConfig
from rljax.rollout import decode, noise
from rljax.rollout.transforms import SamplingParams, pick_tokens_rows


def init_store(cfg: ModelConfig, rows: int, length: int) -> tuple:
  """Zeroed store: per layer ``(k, v)`` [M = rows, G, L = length, Dh] in the compute dtype."""
  return kv_cache.init_cache(cfg, rows, length)


def chunk_attend(write_at, query_at):
  """The attention strategy (``rljax.models.layers.Attend``) of ``S`` tokens per row fed into
  gathered store rows: token ``j`` of row ``i`` writes its key/value at cache index
  ``write_at[i, j]`` (the cache length: nowhere, a padding token) and its query sees the indices
  ``<= query_at[i, j]`` (-1: none). Indices are positions, so this is causal attention over the
  row's whole trajectory, earlier turns included."""
  def attend(q, k, v, layer_cache, window):
    ck, cv = layer_cache  # [R, G, L, Dh]
    if write_at.shape[1] == 1:
      # One token per row (decode): a per-row dynamic_update_slice, measured 1.5x faster on CPU
      # than the scatter. A lane with nothing to write (index L) writes at L - 1 instead: never
      # read before it is written again (``run_lanes``' span).
      at = jnp.minimum(write_at[:, 0], ck.shape[2] - 1)
      put = lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (0, i, 0))
      ck = jax.vmap(put)(ck, k.transpose(0, 2, 1, 3).astype(ck.dtype), at)
      cv = jax.vmap(put)(cv, v.transpose(0, 2, 1, 3).astype(cv.dtype), at)
    else:
      rows = jnp.arange(ck.shape[0])[:, None]
      # [R, S] advanced indices around a slice: the updated view is [R, S, G, Dh], k's layout.
      ck = ck.at[rows, :, write_at].set(k.astype(ck.dtype), mode="drop")
      cv = cv.at[rows, :, write_at].set(v.astype(cv.dtype), mode="drop")
    q_at = query_at[:, query_at.shape[1] - q.shape[1]:]  # the last Sq (``last_only``)
    k_at = jnp.arange(ck.shape[2])
    ok = k_at[None, None, :] <= q_at[:, :, None]
    if window is not None:
      ok = ok & (q_at[:, :, None] - k_at[None, None, :] < window)
    return kv_cache.cache_attention(q, ck, cv, ok[:, None, None]), (ck, cv)
  return attend


def _draw_keys(key, segment, t):
  """Per-row keys ``fold_in(fold_in(key, segment[i]), t[i])`` (threefry: their uint32 words)."""
  keys = jax.vmap(lambda s, u: jax.random.fold_in(jax.random.fold_in(key, s), u))(segment, t)
  return noise.key_data(keys) if noise.is_threefry(key) else keys


def _gather(store, idx, span: int):
  """The first ``span`` cache indices of store rows ``idx`` (``M``: any row, never written back):
  a call reads only the part of the rows that its tokens can reach, since attention over all
  ``L`` indices at every step was most of a decode step's time on CPU."""
  m = store[0][0].shape[0]
  return jax.tree.map(lambda x: x[jnp.minimum(idx, m - 1), :, :span], store)


def _scatter(store, idx, rows, lo, width: int):
  """Cache indices ``lo[i] .. lo[i] + width`` of ``rows`` back into ``store`` at ``idx``: all that
  a call wrote (a ``dynamic_slice`` window, shifted back where it would pass the rows' end, so
  it still holds every index from ``lo[i]`` on), a fraction of the rows it read; an index ``M``
  (a padding row) writes nothing."""
  width = min(width, rows[0][0].shape[2])

  def put(s, r):
    at = jnp.clip(lo, 0, r.shape[2] - width)  # where dynamic_slice starts the window
    win = jax.vmap(lambda x, a: jax.lax.dynamic_slice_in_dim(x, a, width, axis=1))(r, at)
    pos = at[:, None] + jnp.arange(width)[None, :]
    # [W, width] advanced indices around a slice: the updated view is [W, width, G, Dh].
    return s.at[idx[:, None], :, pos].set(win.transpose(0, 2, 1, 3), mode="drop")
  return jax.tree.map(put, store, rows)


def _head(cfg, weights, hidden):
  return transformer.softcap(cfg, jnp.dot(hidden, weights["head"],
                                          preferred_element_type=jnp.float32))


@functools.partial(jax.jit, static_argnames=("cfg", "sp", "steps", "span"),
                   donate_argnums=(1,))
def run_lanes(weights, store, idx, tok, chunk, chunk_mask, start, budget, drawn, key, segment,
              noise_rows, want, *, cfg: ModelConfig, sp: SamplingParams, steps: int, span: int):
  """Feed rows entering lanes their new ids, then decode ``W`` lanes one token per lane and
  step: at most ``steps`` draws per lane, fewer once ``want`` lanes ended their segment or none
  is left.

  Admitting rows and decoding are one call (one dispatch, one gather and scatter of the rows).
  Its first step feeds the first ``E`` lanes their entering rows' chunks ``[E, C]`` (a prompt,
  or the last sampled token and the observation) and every other lane its last drawn token, and
  draws one token per lane; only the entering lanes pay for a chunk's width.

  idx: [W] store rows (``M``: an idle lane). tok: [W] each decoding lane's last drawn token, not
  in the cache yet (lanes ``>= E``). chunk, chunk_mask: [E, C] the entering rows' new ids,
  left-padded (a live lane's chunk ends with a real id). start: [W] the cache index of each
  lane's first fed id (the tokens its row holds). budget: [W] tokens the lane may still draw in
  its segment (0: idle). drawn: [W] tokens drawn in the segment so far (the key index of the
  next one). segment: [W] the segment being drawn (its key); noise_rows: [W] the rows' batch
  indices. span: the cache indices the call reads and writes (static; above ``start + fed - 1 +
  min(steps, budget)`` of every lane, ``fed`` its real ids in the first step: a lane that ended
  writes at ``span - 1``, past all it holds). Returns ``(store, tokens, sampler_logp, draw_logp
  [W, steps], count [W], running [W], steps_run)``: lane ``i`` drew ``tokens[i, :count[i]]``,
  having been fed its chunk (or ``tok``) and ``tokens[i, :count[i] - 1]``; ``running`` lanes
  neither stopped nor spent their budget (the host continues them).
  """
  stop_arr = jnp.asarray(tuple(sp.stop_ids or ()) or (-1,), jnp.int32)
  pad = jnp.int32(sp.pad_id)
  w, (e, c) = idx.shape[0], chunk.shape
  live0 = budget > 0
  n = jnp.concatenate([jnp.sum(chunk_mask > 0, 1), jnp.ones((w - e,), jnp.int32)])

  def feed(rows, tokens, at, fed, count, lanes=slice(None)):
    """One forward of ``tokens`` [R, S] at cache indices ``at`` (where ``fed``) of ``lanes``'
    rows and their draws."""
    hidden, rows, _ = decode.step(cfg, weights, tokens, jnp.where(fed, at, 0), rows, None, None,
                                  attend=chunk_attend(jnp.where(fed, at, span),
                                                      jnp.where(fed, at, -1)))
    keys = _draw_keys(key, segment[lanes], drawn[lanes] + count)
    return (rows,) + pick_tokens_rows(_head(cfg, weights, hidden), keys, noise_rows[lanes], sp)

  def record(i, tok, count, live, out, new, lp, dlp):
    """Step ``i``'s draws of the live lanes into ``out``; which lanes go on."""
    col = lambda x, v: jax.lax.dynamic_update_slice_in_dim(x, v[:, None], i, axis=1)
    out = (col(out[0], jnp.where(live, new, pad)), col(out[1], jnp.where(live, lp, 0.0)),
           col(out[2], jnp.where(live, dlp, 0.0)))
    count = count + live
    stop = jnp.any(new[:, None] == stop_arr[None, :], axis=-1)  # (-1: no stop ids)
    return jnp.where(live, new, tok), count, live & ~stop & (count < budget), out

  def cond(s):
    i, _, _, _, live, _ = s
    return (i < steps) & jnp.any(live) & (jnp.sum(live0 & ~live) < want)

  def body(s):
    i, rows, tok, count, live, out = s
    at = (start + n + count - 1)[:, None]  # the fed token's index (= its position)
    rows, new, lp, dlp = feed(rows, tok[:, None], at, live[:, None], count)
    return (i + 1, rows) + record(i, tok, count, live, out, new, lp, dlp)

  zeros = jnp.zeros((w,), jnp.int32)
  decoding = live0 & (jnp.arange(w) >= e)
  rows, new, lp, dlp = feed(_gather(store, idx, span), tok.astype(jnp.int32)[:, None],
                            start[:, None], decoding[:, None], zeros)
  if e:
    at = start[:e, None] + jnp.arange(c)[None, :] - (c - n[:e])[:, None]
    fed = (chunk_mask > 0) & live0[:e, None]
    head, *drew = feed(jax.tree.map(lambda x: x[:e], rows), chunk.astype(jnp.int32), at, fed,
                       zeros[:e], slice(0, e))
    rows = jax.tree.map(lambda x, y: x.at[:e].set(y), rows, head)
    new, lp, dlp = (x.at[:e].set(y) for x, y in zip((new, lp, dlp), drew))
  out = (jnp.full((w, steps), pad, jnp.int32), jnp.zeros((w, steps), jnp.float32),
         jnp.zeros((w, steps), jnp.float32))
  tok, count, live, out = record(0, zeros, zeros, live0, out, new, lp, dlp)
  i, rows, _, count, live, out = jax.lax.while_loop(
      cond, body, (jnp.int32(1), rows, tok, count, live, out))
  written = (c if e else 1) + steps - 1  # indices from ``start`` on that a lane may have written
  return _scatter(store, idx, rows, start, written), out[0], out[1], out[2], count, live, i

"""Continuous batching across turns, the compiled half: a KV-cache *store* whose rows outlive a
turn, so an episode that waits for its environment keeps its cache and re-enters where it left.

The turn-synchronous driver (``rljax.envs.episodes``) re-prefills every row's whole trajectory at
each turn and waits for its slowest row and its slowest tool. Here every episode owns one row of
a device-resident store, per layer ``(k, v)`` [M, G, L, Dh], holding the keys and values of its
trajectory so far (prompt, turns, observations) as one contiguous run from index 0, so that a
token's cache index is its position (the turn-synchronous driver's ``cumsum(mask) - 1`` of the
left-padded sequence). Nothing in it is ever recomputed:

``run_lanes``: ``W`` lanes, each bound to one store row, decode one token per step (a lane's last
drawn token fed at the index after those its row holds, attending causally to all before it);
when lanes end their segments (a stop id or the segment's budget), rows queued by the host take
them inside the call: their new ids (a prompt, or the last sampled token and the observation)
are fed in one chunk forward and their first tokens drawn. The call gathers its lanes' rows of
the store once, runs up to ``steps`` steps, and scatters back the indices it wrote, those of the
rows that left their lanes inside the call included (the store is donated, so the scatter is in
place): a host round trip costs a copy of the rows it touches, not one per step or per
admission.

Which rows run together, and when, never changes a row's tokens: token ``t`` of a row's
segment ``s`` (its ``s``-th sampler segment, see ``rljax.envs.async_turns``) is drawn with
``fold_in(fold_in(key, s), t)`` at the noise counters of the row's index in the batch.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.models import kv_cache, transformer
from rljax.models.config import ModelConfig
from rljax.rollout import decode, noise
from rljax.rollout.sampling import SamplingParams, pick_tokens_rows


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


def _window_start(lo, span: int, width: int):
  """Where the ``width``-index window of a row from cache index ``lo`` starts: at ``lo``, shifted
  back where it would pass the row's ``span`` (it still holds every index from ``lo`` on)."""
  return jnp.clip(lo, 0, span - width)


def _windows(rows, lo, width: int):
  """Per layer ``(k, v)`` [R, G, width, Dh]: cache indices ``_window_start(lo) ..`` of
  ``rows`` [R, G, span, Dh], all that a call may have written to them."""
  def cut(x):
    at = _window_start(lo, x.shape[2], width)
    return jax.vmap(lambda r, a: jax.lax.dynamic_slice_in_dim(r, a, width, axis=1))(x, at)
  return jax.tree.map(cut, rows)


def _scatter(store, idx, windows, at):
  """``windows`` (per layer ``(k, v)`` [R, G, width, Dh], ``_windows``) back into ``store`` rows
  ``idx`` from the indices ``at`` where they start: all that a call wrote, a fraction of the
  rows it read; an index ``M`` (a padding row) writes nothing."""
  def put(s, win):
    pos = at[:, None] + jnp.arange(win.shape[2])[None, :]
    # [R, width] advanced indices around a slice: the updated view is [R, width, G, Dh].
    return s.at[idx[:, None], :, pos].set(win.transpose(0, 2, 1, 3), mode="drop")
  return jax.tree.map(put, store, windows)


def _swap_rows(rows, retired, lane, slot, lo, new, take):
  """An admission's cache moves, per layer ``(k, v)``: where ``take[i]``, the window of
  ``rows[lane[i]]`` from index ``lo[i]`` (``_windows``, as wide as ``retired``'s) goes to
  ``retired[slot[i]]``, then ``new[i]`` replaces the row. Returns ``(rows, retired)``.

  Each row is written with a ``dynamic_update_slice`` that depends on the retired windows' value:
  XLA fused the read of the replaced rows into the windows' update and, unable to order it
  before the write, copied all the lanes' rows twice per admission (as much time as the
  admission's forward) when the write was a scatter or did not depend on the read; an
  ``optimization_barrier`` on ``(retired, rows)`` instead still left one copy of each layer's
  rows in the compiled call."""
  def swap(x, r, y):
    win = _windows(x[lane], lo, r.shape[2])
    r = r.at[jnp.where(take, slot, r.shape[0])].set(win, mode="drop")
    after = jnp.nan_to_num(r[0, 0, 0, 0] * 0.0, nan=0.0, posinf=0.0, neginf=0.0)
    for i in range(lane.shape[0]):
      at = lane[i] + after.astype(lane.dtype)  # = lane[i], known only once ``r`` is written
      old = jax.lax.dynamic_index_in_dim(x, at)
      x = jax.lax.dynamic_update_index_in_dim(x, jnp.where(take[i], y[i:i + 1], old), at, 0)
    return x, r
  pairs = jax.tree.map(swap, rows, retired, new)
  part = lambda i: jax.tree.map(lambda _, p: p[i], rows, pairs)
  return part(0), part(1)


def _head(cfg, weights, hidden):
  return transformer.softcap(cfg, jnp.dot(hidden, weights["head"],
                                          preferred_element_type=jnp.float32))


@functools.partial(jax.jit, static_argnames=("cfg", "sp", "steps", "span", "admit_rows"),
                   donate_argnums=(1,))
def run_lanes(weights, store, lanes: dict, queue: dict, key, want, *, cfg: ModelConfig,
              sp: SamplingParams, steps: int, span: int, admit_rows: int):
  """Decode ``W`` lanes one token per lane and step, for at most ``steps`` steps; whenever
  ``admit_rows`` lanes are free (or as many as there are queued rows left), the next queued rows
  take them: their new ids are fed (one ``[K, C]`` chunk forward, ``K = admit_rows``) and their
  first tokens drawn, without returning to the host.

  A host round trip (dispatch, gathering the lanes' rows of the store, scattering back what was
  written, the host's bookkeeping) cost ~5 ms on CPU against ~0.8 ms per decode step, and while
  the host refilled ended lanes, calls returned every ~4 steps
  (docs/results/benchmarks/multiturn.md); admitting queued rows here lets a call run its ``steps``. A row
  whose segment ends inside the call is handed back (its environment steps) when the call
  returns, so ``steps`` also bounds how long a tool call waits to be submitted.

  lanes: [W] arrays: ``idx`` the lane's store row (``M``: a free lane), ``tok`` its last drawn
  token (not in the cache yet), ``start`` its cache index, ``budget`` the tokens its segment may
  still draw (0: free), ``drawn`` those drawn so far (the next one's key index), ``segment`` the
  segment being drawn (its key). queue: the rows waiting to enter, in order, a prefix of [Q]
  (``budget`` 0 after it): ``idx``, ``chunk`` / ``mask`` [Q, C] their new ids left-padded (a
  prompt, or the last sampled token and the observation), ``start`` the cache index of the
  first fed id (the ids the row holds), ``budget``, ``segment``; a queued row draws from its
  segment's first token. want: once the queue is empty, return when this many more lanes are
  free than the queue could have filled. span: the cache indices the call reads (static; above
  every row's ``start + fed - 1 + min(steps + 1, budget)``: an ended lane writes at
  ``span - 1``).

  Noise: token ``t`` of a row's segment ``s`` is drawn with ``fold_in(fold_in(key, s), t)`` at
  the row's own noise counters (its store row), whichever lane, step or call draws it.

  Returns ``(store, out)``; ``out`` holds per *record* (``R = W + Q``: the lanes' segments,
  then the queue's rows) ``tokens``, ``sampler_logp``, ``draw_logp`` [R, steps + 1] (a row that
  enters before the first step draws one token more than the steps) and ``count``
  [R]: record ``i`` drew ``tokens[i, :count[i]]`` (0: a queued row that did not enter), having
  been fed its chunk (or ``tok``) and ``tokens[i, :count[i] - 1]``; ``running`` [R] records
  that neither stopped nor spent their budget (the host continues them); ``steps`` decode steps
  run; ``admissions`` chunk forwards run.
  """
  stop_arr = jnp.asarray(tuple(sp.stop_ids or ()) or (-1,), jnp.int32)
  pad = jnp.int32(sp.pad_id)
  m = store[0][0].shape[0]
  w, (q, c), k = lanes["idx"].shape[0], queue["chunk"].shape, admit_rows
  n_rec = w + q
  # A record draws at most ``steps + 1`` tokens (a row that enters before the first step draws
  # one from its chunk, then one per step), so it writes at most ``c + steps`` indices from start.
  written = min(c + steps, span)
  n_queued = jnp.sum(queue["budget"] > 0)
  noise_rows = lambda idx: jnp.minimum(idx, m - 1)

  def forward(rows, tokens, at, fed, segment, t, idx):
    """One forward of ``tokens`` [R, S] at cache indices ``at`` (where ``fed``) of ``rows``
    and the draws of key index ``t``."""
    hidden, rows, _ = decode.step(cfg, weights, tokens, jnp.where(fed, at, 0), rows, None, None,
                                  attend=chunk_attend(jnp.where(fed, at, span),
                                                      jnp.where(fed, at, -1)))
    keys = _draw_keys(key, segment, t)
    return (rows,) + pick_tokens_rows(_head(cfg, weights, hidden), keys, noise_rows(idx), sp)

  def record(s, which, new, lp, dlp):
    """The draws [W] of lanes ``which`` into their records; which lanes go on."""
    ln = s["lane"]
    rec = jnp.where(which, ln["rec"], n_rec)
    put = lambda x, v: x.at[rec, ln["count"]].set(v, mode="drop")
    count = ln["count"] + which
    stop = jnp.any(new[:, None] == stop_arr[None, :], axis=-1)  # (-1: no stop ids)
    lane = dict(ln, tok=jnp.where(which, new, ln["tok"]), count=count,
                live=jnp.where(which, ~stop & (count < ln["cap"]), ln["live"]))
    out = dict(s["out"], tokens=put(s["out"]["tokens"], new),
               sampler_logp=put(s["out"]["sampler_logp"], lp),
               draw_logp=put(s["out"]["draw_logp"], dlp),
               count=s["out"]["count"].at[rec].add(1, mode="drop"))
    return dict(s, lane=lane, out=out)

  def decode_step(s):
    ln = s["lane"]
    live = ln["live"]
    at = ln["start"] + ln["n"] + ln["count"] - 1  # the fed token's index (= its position)
    rows, new, lp, dlp = forward(s["rows"], ln["tok"][:, None], at[:, None], live[:, None],
                                 ln["segment"], ln["drawn"] + ln["count"], ln["idx"])
    return dict(record(dict(s, rows=rows), live, new, lp, dlp), i=s["i"] + 1)

  def admit_due(s):
    left = n_queued - s["admitted"]
    return (left > 0) & (jnp.sum(~s["lane"]["live"]) >= jnp.minimum(k, left))

  def admit(s):
    """The next ``K`` queued rows take the first free lanes: the rows those lanes served put
    aside what they wrote (``retired``, written back at the end), the queued rows' caches
    come from the store, their chunks are fed and their first tokens drawn."""
    ln = s["lane"]
    lane = jnp.nonzero(~ln["live"], size=k, fill_value=w)[0]
    j = s["admitted"] + jnp.arange(k)
    take = (lane < w) & (j < n_queued)  # a prefix of the K
    to = jnp.where(take, lane, w)  # lane indices, w: dropped
    lj, qj = jnp.minimum(lane, w - 1), jnp.minimum(j, q - 1)
    mask = queue["mask"][qj] > 0
    fed_n = jnp.sum(mask, 1)
    at = queue["start"][qj, None] + jnp.arange(c)[None, :] - (c - fed_n)[:, None]
    idx = jnp.where(take, queue["idx"][qj], m)

    def chunk_forward(cut: int):
      """The chunks' last ``c - cut`` columns (left-padded: all the ids when ``cut`` <= the
      padding of every row taken)."""
      return lambda rows: forward(rows, queue["chunk"][qj][:, cut:], at[:, cut:],
                                  (mask & take[:, None])[:, cut:], queue["segment"][qj],
                                  jnp.zeros((k,), jnp.int32), idx)
    entering = _gather(store, idx, span)
    if c % 2 or c < 2:
      entering, new, lp, dlp = chunk_forward(0)(entering)
    else:  # the forward costs per fed column: half the width when the ids fit (re-entries)
      fits = jnp.max(jnp.where(take, fed_n, 0)) <= c // 2
      entering, new, lp, dlp = jax.lax.cond(fits, chunk_forward(c // 2), chunk_forward(0),
                                            entering)
    slot = jnp.where(take, j, q)
    rows, retired_rows = _swap_rows(s["rows"], s["retired"]["rows"], lj, slot, ln["start"][lj],
                                    entering, take)
    put_q = lambda x, v: x.at[slot].set(v, mode="drop")
    retired = dict(rows=retired_rows, idx=put_q(s["retired"]["idx"], ln["idx"][lj]),
                   at=put_q(s["retired"]["at"], _window_start(ln["start"][lj], span, written)))
    put = lambda x, v: x.at[to].set(v, mode="drop")
    lane_state = dict(idx=put(ln["idx"], idx), rec=put(ln["rec"], w + j),
                      start=put(ln["start"], queue["start"][qj]), n=put(ln["n"], fed_n),
                      count=put(ln["count"], jnp.zeros((k,), jnp.int32)),
                      cap=put(ln["cap"], queue["budget"][qj]),
                      drawn=put(ln["drawn"], jnp.zeros((k,), jnp.int32)),
                      segment=put(ln["segment"], queue["segment"][qj]),
                      tok=ln["tok"], live=ln["live"])
    spread = lambda v: jnp.zeros((w,), v.dtype).at[to].set(v, mode="drop")
    s = dict(s, lane=lane_state, retired=retired, admitted=s["admitted"] + jnp.sum(take),
             admissions=s["admissions"] + 1, rows=rows)
    return record(s, spread(take), spread(new), spread(lp), spread(dlp))

  idle0 = jnp.sum(lanes["budget"] <= 0)
  spare = jnp.maximum(idle0 - n_queued, 0)  # lanes the queue cannot fill

  def cond(s):
    live = s["lane"]["live"]
    queued = s["admitted"] < n_queued
    return ((s["i"] < steps) & (jnp.any(live) | admit_due(s))
            & (queued | (jnp.sum(~live) - spare < want)))

  def body(s):
    return decode_step(jax.lax.while_loop(admit_due, admit, s))

  live0 = lanes["budget"] > 0
  rows = _gather(store, lanes["idx"], span)
  zeros = jnp.zeros((w,), jnp.int32)
  s = dict(
      i=jnp.int32(0), admitted=jnp.int32(0), admissions=jnp.int32(0), rows=rows,
      lane=dict(idx=lanes["idx"], rec=jnp.arange(w), start=lanes["start"],
                n=jnp.ones((w,), jnp.int32), count=zeros,
                cap=lanes["budget"], drawn=lanes["drawn"],
                segment=lanes["segment"], tok=lanes["tok"], live=live0),
      retired=dict(rows=jax.tree.map(lambda x: jnp.zeros((q,) + x.shape[1:2] + (written,)
                                                         + x.shape[3:], x.dtype), rows),
                   idx=jnp.full((q,), m, jnp.int32), at=jnp.zeros((q,), jnp.int32)),
      out=dict(tokens=jnp.full((n_rec, steps + 1), pad, jnp.int32),
               sampler_logp=jnp.zeros((n_rec, steps + 1), jnp.float32),
               draw_logp=jnp.zeros((n_rec, steps + 1), jnp.float32),
               count=jnp.zeros((n_rec,), jnp.int32)))
  s = jax.lax.while_loop(cond, body, s)
  ln = s["lane"]
  win, win_at = _windows(s["rows"], ln["start"], written), _window_start(ln["start"], span,
                                                                         written)
  every = lambda a, b: jnp.concatenate([a, b])
  store = _scatter(store, every(ln["idx"], s["retired"]["idx"]),
                   jax.tree.map(every, win, s["retired"]["rows"]),
                   every(win_at, s["retired"]["at"]))
  running = jnp.zeros((n_rec,), bool).at[jnp.where(ln["live"], ln["rec"], n_rec)].set(
      True, mode="drop")
  return store, dict(s["out"], running=running, steps=s["i"], admissions=s["admissions"])

"""Sequence packing: a batch's sequences laid into rows of a fixed width, and back.

The scoring forwards and the update's forwards run on *packed* rows instead of the padded
``[B, S]`` rectangle: each row ``b``'s valid tokens (prompt + completion, its observations in a
multi-turn record) are one *segment* of a packed row of width ``W >= S``; a packed row holds
several segments, numbered ``1, 2, ...`` along it (0 = padding), each starting at position 0.
The forward's per-token outputs come back to ``[B, S]`` (or ``[B, T]``) by an index gather, so
every loss, estimator and mask runs on the padded layout exactly as without packing.

The layout is computed inside the compiled step (the update's minibatches are drawn there), in
a static shape: ``C`` chunks of ``R`` rows of ``W`` (``chunk_shape``). A row holds at least one
sequence, so ``ceil(B / R)`` chunks always suffice; the chunks the batch leaves empty are skipped
at run time (``used_chunks``), never compiled anew.

Placement is first-fit decreasing (Johnson 1973): sequences by decreasing length, each into the
first row with room; used rows form a prefix, filled chunk by chunk.

Packing saves work only by the chunks it leaves empty: in a layout of one chunk it computes as
many rows as the padded forward plus the layout's gathers. ``packs`` says, per forward, whether
``model.pack`` packs it.

Exact means: every sequence's per-token outputs are those of the padded forward, because a
sequence attends only to itself and every other layer is per token. MoE layers keep that under a
dropless dispatch ('sparse', 'dense': each token's experts and gates are its own). Under
'capacity' dispatch they do not: which token-choice pairs an expert drops depends on every token
of the forward (``C = ceil(f T k / E)`` of its ``T`` tokens, the queue in their order), so a
layout that puts other tokens together, or in another order, computes another function, not a
rounding of the same one. Such a model is never packed ('auto' keeps the padded rows; True is
refused at start-up). Its padded forwards share the property with micro-batches and
``model.forward_tokens`` row chunks: under capacity dispatch, the update is exact per forward.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.config.table import (AUTO_PACK_MIN_CHUNKS, AUTO_PACK_PLATFORMS, CAPACITY_UNPACKED,
                                options)

SETTINGS = options("model.pack")  # 'auto' and the strings of True / False a command line gives


def forced(setting) -> bool | None:
  """``model.pack`` as True / False where it forces the layout, None for 'auto'."""
  if setting == "auto":
    return None
  if isinstance(setting, bool):
    return setting
  if setting in SETTINGS:
    return setting.lower() == "true"
  raise ValueError(f"model.pack={setting!r}: expected one of {list(SETTINGS)} or a bool")


def packs(setting, chunks: int, platform: str, capacity: bool = False) -> bool:
  """``model.pack`` resolved for a forward whose packed layout (``chunk_shape``) has ``chunks``
  chunks on ``platform``: True / False (or their strings) force it; 'auto' packs on
  ``AUTO_PACK_PLATFORMS`` when ``chunks >= AUTO_PACK_MIN_CHUNKS`` (``rljax/config/table.py`` says
  why and where it was measured). ``capacity``: the model's MoE layers dispatch by capacity,
  which never packs (``CAPACITY_UNPACKED``: 'auto' resolves padded, True is a ValueError)."""
  force = forced(setting)
  if capacity:
    if force:
      raise ValueError(CAPACITY_UNPACKED)
    return False
  if force is None:
    return platform in AUTO_PACK_PLATFORMS and chunks >= AUTO_PACK_MIN_CHUNKS
  return force


def pack_setting(setting, model_cfg):
  """``model.pack`` as a policy resolves it: 'auto' is the padded rows (False) for a policy that
  takes images (the learner scores rows with images unpacked); any other setting as given."""
  return False if model_cfg.vision is not None and setting == "auto" else setting


def packed_shape(setting, platform: str, rows: int, width: int, max_tokens: int,
                 shards: int = 1, at_least: int = 1, capacity: bool = False) -> tuple | None:
  """``(C, R, W)``: the packed chunks (``chunk_rows`` rows as wide as the padded ones) of a
  forward over ``rows`` rows of ``width`` tokens (``max_tokens`` per shard a chunk, 0 for no
  limit; ``at_least`` micro-batches), or None where ``model.pack=setting`` resolves to the
  padded rows for it (``packs``; ``capacity``: MoE layers dispatched by capacity)."""
  shape = chunk_shape(rows, width, chunk_rows(rows, width, max_tokens, shards, at_least))
  return shape if packs(setting, shape[0], platform, capacity) else None


class Layout(NamedTuple):
  """Where each sequence of a ``[B, S]`` batch sits in ``[C, R, W]`` packed chunks.

  row: [B] int32, the packed row (``0 .. C * R - 1``; chunk ``row // R``, row ``row % R``).
  offset: [B] int32, the column of the sequence's first token.
  segment: [B] int32, its segment id in that row (1, 2, ... in column order).
  lengths: [B] int32, its valid tokens.
  used_rows: [] int32, the packed rows that hold a token.
  shape: ``(C, R, W)``, static.
  """
  row: jax.Array
  offset: jax.Array
  segment: jax.Array
  lengths: jax.Array
  used_rows: jax.Array
  shape: tuple

  @property
  def used_chunks(self) -> jax.Array:
    """[] int32: the chunks that hold a token, ``ceil(used_rows / R)`` (0 for an empty batch)."""
    rows = self.shape[1]
    return (self.used_rows + rows - 1) // rows

  @property
  def fill(self) -> jax.Array:
    """[] float32: the fraction of the used chunks' slots that hold a token."""
    c, r, w = self.shape
    slots = jnp.maximum(self.used_chunks * r * w, 1)
    return self.lengths.sum().astype(jnp.float32) / slots


def chunk_rows(rows: int, width: int, max_tokens: int, shards: int = 1, at_least: int = 1) -> int:
  """Packed rows of ``width`` tokens a chunk for ``rows`` sequences over ``shards`` data shards:
  as many as ``max_tokens`` per shard allows (at least one per shard), never more than a padded
  micro-batch's rows (``rows / at_least``); with no token limit (0), a padded micro-batch's."""
  micro = rows // at_least if rows % at_least == 0 else rows
  if not max_tokens:
    return micro
  return min(shards * max(1, max_tokens // width), micro)


def chunk_shape(rows: int, width: int, chunk_rows: int) -> tuple:
  """``(C, R, W)`` for ``rows`` sequences of at most ``width`` tokens in chunks of
  ``chunk_rows`` rows (``R`` = ``chunk_rows`` capped at ``rows``; ``C = ceil(rows / R)``: every
  sequence alone in its row still fits)."""
  if rows < 1 or width < 1 or chunk_rows < 1:
    raise ValueError(f"packing needs positive sizes: rows={rows}, width={width}, "
                     f"chunk_rows={chunk_rows}")
  r = min(chunk_rows, rows)
  return (-(-rows // r), r, width)


def first_fit_decreasing(lengths, shape: tuple) -> Layout:
  """The layout of sequences of ``lengths`` [B] (each ``<= W``) in chunks of ``shape``
  ``(C, R, W)``: by decreasing length (ties in row order), each into the lowest row whose free
  columns hold it. Jittable; ``B`` sequential steps of ``O(B)`` work."""
  lengths = jnp.asarray(lengths, jnp.int32)
  b = lengths.shape[0]
  c, r, w = shape
  bins = c * r
  order = jnp.argsort(-lengths, stable=True)

  def place(i, carry):
    free, count, row, offset, segment = carry
    seq = order[i]
    n = lengths[seq]
    target = jnp.argmax(free >= n).astype(jnp.int32)  # first row with room (one always has)
    row = row.at[seq].set(target)
    offset = offset.at[seq].set(w - free[target])
    segment = segment.at[seq].set(count[target] + 1)
    return (free.at[target].add(-n), count.at[target].add(1), row, offset, segment)

  zeros = jnp.zeros((b,), jnp.int32)
  free, _, row, offset, segment = jax.lax.fori_loop(
      0, b, place, (jnp.full((bins,), w, jnp.int32), jnp.zeros((bins,), jnp.int32), zeros,
                    zeros, zeros))
  used = (free < w).sum().astype(jnp.int32)
  return Layout(row=row, offset=offset, segment=segment, lengths=lengths, used_rows=used,
                shape=tuple(shape))


def layout(valid, shape: tuple) -> Layout:
  """First-fit-decreasing layout of the rows of ``valid`` [B, S] (their valid tokens, in order,
  are one sequence each; ``S <= W``)."""
  if valid.shape[1] > shape[2]:
    raise ValueError(f"rows of {valid.shape[1]} tokens do not fit packed rows of {shape[2]}")
  return first_fit_decreasing((valid > 0).astype(jnp.int32).sum(axis=1), shape)


def slots(valid, lay: Layout):
  """``(row, col)`` [B, S] int32: the packed row and column of every valid slot of ``valid``
  [B, S] (its rank among the row's valid tokens past the sequence's offset); ``row`` is
  ``C * R`` (out of range) on padding, so scatters drop it and gathers fill it."""
  valid = valid.astype(bool)
  rank = jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1
  c, r, _ = lay.shape
  row = jnp.where(valid, lay.row[:, None], c * r)
  return row, jnp.where(valid, lay.offset[:, None] + rank, 0)


def pack(x, valid, lay: Layout, fill=0):
  """``x`` [B, S, ...] -> [C, R, W, ...]: every valid slot's value at its packed place,
  ``fill`` where no token is."""
  c, r, w = lay.shape
  row, col = slots(valid, lay)
  out = jnp.full((c * r, w) + x.shape[2:], fill, x.dtype)
  out = out.at[row, col].set(x, mode="drop", unique_indices=True)
  return out.reshape((c, r, w) + x.shape[2:])


def segment_ids(valid, lay: Layout):
  """[C, R, W] int32: each packed slot's segment id (1, 2, ... along a packed row), 0 where no
  token is. A row of ``valid`` that holds segment ids (several samples of one episode:
  ``rljax.agents.trajectory``) keeps them apart: each of its segments is a segment of the packed
  row, numbered in order (for 0/1 rows the ids are ``Layout.segment``)."""
  keyed = pack(lay.segment[:, None] * (valid.shape[1] + 1) + valid.astype(jnp.int32), valid, lay)
  before = jnp.concatenate([jnp.zeros_like(keyed[..., :1]), keyed[..., :-1]], axis=-1)
  starts = (keyed > 0) & (keyed != before)
  return jnp.where(keyed > 0, jnp.cumsum(starts.astype(jnp.int32), axis=-1), 0)


def next_tokens(tokens, valid, lay: Layout):
  """[C, R, W]: at each packed slot the token that follows it in its sequence (0 after a
  sequence's last token): the targets of a language model's packed outputs."""
  following = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
  has_next = jnp.concatenate([valid[:, 1:], jnp.zeros_like(valid[:, :1])], axis=1)
  return pack(jnp.where(has_next.astype(bool), following, 0), valid, lay)


def unpack(y, valid, lay: Layout, chunk=None):
  """``y`` [C, R, W, ...] (or one chunk's [R, W, ...] with its index ``chunk``) -> [B, S, ...]:
  each valid slot's packed value, 0 on padding (and, for one chunk, on the rows of others)."""
  c, r, w = lay.shape
  row, col = slots(valid, lay)
  if chunk is None:
    flat = y.reshape((c * r, w) + y.shape[3:])
  else:
    flat = y
    row = jnp.where(row // r == chunk, row % r, r)  # another chunk's rows: out of range
  return flat.at[row, col].get(mode="fill", fill_value=0)


def completion(y_slots, valid, prompt_width: int):
  """Per-slot outputs ``y_slots`` [B, S, ...] of next-token predictions -> the completion's
  [B, T, ...]: token ``t`` (slot ``P + t``) is predicted at slot ``P + t - 1``; 0 where that slot
  or the token is padding (a packed forward never sees that pair)."""
  p = prompt_width
  both = valid[:, p - 1:-1].astype(bool) & valid[:, p:].astype(bool)
  out = y_slots[:, p - 1:-1]
  return jnp.where(both.reshape(both.shape + (1,) * (out.ndim - 2)), out, 0)

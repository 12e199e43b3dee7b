"""The rollout sampler: prefill + KV-cache decode in one jitted function, with group sampling.

``sample(cfg, params, prompt_tokens, prompt_mask, key, sp, group_size)`` turns ``Pn`` left-padded
prompts ``[Pn, P]`` into ``B = Pn * group_size`` completions (groups contiguous: rows
``i*G .. i*G+G-1`` continue prompt ``i``) of exactly ``T = sp.max_new_tokens`` slots.

How it runs (all inside one ``jax.jit``; no host round trip per token):

1. Prefill the ``Pn`` *distinct* prompts once into a KV cache (``decode.step`` with ``S = P``),
   then repeat the cache ``G`` times (group sampling costs one prefill per prompt, not per
   completion).
2. Sample the first token from the last prompt position's logits (``hidden @ head``, one
   ``[B, V]`` row block at a time: ``[B, T, V]`` logits never exist).
3. Decode: ``lax.while_loop`` whose body feeds the previous token through ``decode.step``
   (``S = 1``) and samples the next one; it stops as soon as every row has emitted a stop token,
   or after ``T`` tokens. The loop is split into a few static *segments* whose cache grows
   (``P + 16``, ``P + 32``, ... slots): attention reads only the part of the cache that can be
   filled, so a decode step costs about the filled context, not ``P + T``. The cache is the only
   sequence-length-sized buffer.
4. On CPU, small models decode their rows in sequential cache-sized chunks (``prompts_per_chunk``).

``decode.step`` is the model's forward (``rljax.models.transformer``) through the head-major KV
cache (``rljax.models.kv_cache``); the tests pin it to a teacher-forced forward and to
``transformers``.

Log-probabilities returned per completion token (both of the *sampled* token):

- ``Rollout.sampler_logp``: under the **policy** as the sampler computed it, i.e. ``log_softmax``
  of the raw, temperature-1 logits (``sampler_logp`` in docs/algorithms.md). Importance-sampling
  corrections use it; in float32 it equals a teacher-forced forward pass.
- ``Rollout.draw_logp``: under the **processed sampling distribution** the token was actually
  drawn from (temperature, top-k, top-p, min-p applied and renormalised). ``0`` for greedy.

Continuous batching (``max_concurrent_rows`` / ``kv_cache_bytes``): when a shard has more rows
than its slot budget ``S``, ``continuous.decode_rows`` decodes them through ``S`` cache slots
instead of all at once (docs/rollout.md gives the rule); the rollout is the same.

Randomness: one ``jax.random`` key; decode step ``t`` uses ``fold_in(key, t)`` and draws
independent noise per row, so group members differ and the same key reproduces the same rollout
(independently of how the batch is sharded: threefry is partitionable).

Compilation: ``sample`` is compiled once per distinct ``(cfg, sp, group_size)`` and input shape
``(Pn, P)``. Prompts are left-padded to a multiple of a bucket (``text.left_pad``), so a run with
a fixed number of prompts per step compiles ``ceil(max_prompt_len / bucket)`` times at most.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rljax.models import kv_cache, transformer
from rljax.models.config import ModelConfig
from rljax.rollout import continuous, decode, noise, spec_decode, speculative
from rljax.rollout.decode import logits_of
from rljax.rollout.record import Rollout  # noqa: F401 (re-exported: the sampler's output)
from rljax.rollout.sampling import (SamplingParams, _is_identity, pick_tokens,  # noqa: F401
                                      process_logits)
from rljax.vision import multimodal

# The decode loop is split into segments of about this many steps (the cache grows between
# them); at most ``_MAX_SEGMENTS`` segments, since each one is a separately compiled loop body.
_SEGMENT_STEPS = 16
_MAX_SEGMENTS = 4
# On CPU, small models decode the batch in sequential chunks of rows whose KV cache is about this
# many bytes (``prompts_per_chunk``; tuned on a 2-core EPYC with 2 MiB L2 per core, 32 MiB L3).
CPU_CHUNK_BYTES = 8 << 20
CPU_CHUNK_MAX_WEIGHT_BYTES = 8 << 20  # larger models: re-reading weights per chunk costs more
# Continuous batching's CPU chunks keep at least this many slots: with fewer, each chunk's own
# steps (every one re-reading the weights) and drain tail cost more than its cache residency
# saves (measured in docs/rollout.md).
CPU_MIN_CHUNK_SLOTS = 16


# --- the sampler ---------------------------------------------------------------------------------

def _segments(p: int, t: int) -> list[tuple[int, int, int]]:
  """Decode steps 1..T-1 split into (first, end, cache slots) segments; step s needs P+s slots."""
  if t <= 1:
    return []
  n = int(min(_MAX_SEGMENTS, max(1, round((t - 1) / _SEGMENT_STEPS))))
  bounds = sorted(set(np.linspace(1, t, n + 1).round().astype(int).tolist()))
  return [(a, b, p + b - 1) for a, b in zip(bounds[:-1], bounds[1:])]


def _grow_cache(cache, slots: int):
  """Pad every head-major cache array [B, G, K, Dh] to ``slots`` slots (no-op if it has them)."""
  if cache[0][0].shape[2] == slots:
    return cache
  return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, slots - x.shape[2]), (0, 0))),
                      cache)


def _cache_bytes_per_row(cfg: ModelConfig, slots: int) -> int:
  itemsize = jnp.dtype(cfg.dtype).itemsize
  return 2 * cfg.num_layers * cfg.num_kv_heads * slots * cfg.head_dim * itemsize


def prompts_per_chunk(cfg: ModelConfig, n_prompts: int, p: int, group_size: int,
                      t_max: int) -> int:
  """How many prompts one sequential chunk of the batch decodes (a divisor of ``n_prompts``).

  A decode step reads the whole KV cache and all the weights. On CPU, when the weights are small
  (at most ``CPU_CHUNK_MAX_WEIGHT_BYTES``), the rows are decoded in sequential chunks whose cache
  is about ``CPU_CHUNK_BYTES``: the chunk's cache then stays in the CPU caches for all its steps
  instead of streaming from DRAM at every step, which costs only re-reading the (cache-resident)
  weights once per chunk and step. Larger models, and other backends, decode the whole batch at
  once. A chunk always holds whole groups.
  """
  if jax.default_backend() not in decode.CPU_TUNED_BACKENDS:
    return n_prompts
  weight_bytes = cfg.num_params() * jnp.dtype(cfg.param_dtype).itemsize
  if weight_bytes > CPU_CHUNK_MAX_WEIGHT_BYTES:
    return n_prompts
  rows = max(1, CPU_CHUNK_BYTES // _cache_bytes_per_row(cfg, p + t_max))
  return max(d for d in range(1, n_prompts + 1) if n_prompts % d == 0 and d * group_size <= rows
             or d == 1)


SAMPLER_DTYPES = ("float32", "bfloat16", "float16")


def resolve_stop_ids(sp: SamplingParams, cfg: ModelConfig) -> tuple:
  """``sp.stop_ids``, or the model's EOS ids (``cfg.eos_token_id``) when it is ``None``."""
  if sp.stop_ids is not None:
    return sp.stop_ids
  eos = cfg.eos_token_id
  return () if eos is None else tuple(int(e) for e in np.atleast_1d(eos))


def slot_budget(cfg: ModelConfig, rows: int, p: int, t_max: int,
                max_concurrent_rows: int | None, kv_cache_bytes: int | None) -> int:
  """Rows one decode loop runs at a time: ``rows``, capped by ``max_concurrent_rows`` and by how
  many rows' KV caches of ``p + t_max`` slots fit in ``kv_cache_bytes`` (None or 0: no cap)."""
  budget = rows
  if max_concurrent_rows:
    budget = min(budget, int(max_concurrent_rows))
  if kv_cache_bytes:
    fit = int(kv_cache_bytes) // _cache_bytes_per_row(cfg, p + t_max)
    if fit < 1:
      raise ValueError(f"rollout.kv_cache_bytes={kv_cache_bytes} holds no row: one row's cache "
                       f"of {p + t_max} slots takes {_cache_bytes_per_row(cfg, p + t_max)} bytes")
    budget = min(budget, fit)
  if budget < 1:
    raise ValueError(f"rollout.max_concurrent_rows must be >= 1 (or 0 = no cap), got "
                     f"{max_concurrent_rows}")
  return budget


def sampler_config(cfg: ModelConfig, dtype: str | None) -> ModelConfig:
  """The model config the sampler computes with: ``dtype`` (weights and KV cache) if given."""
  if dtype is None or dtype == cfg.dtype:
    return cfg
  if dtype not in SAMPLER_DTYPES:
    raise ValueError(f"rollout.dtype must be one of {SAMPLER_DTYPES} (or None: the model's "
                     f"dtype), got {dtype!r}")
  return cfg.replace(dtype=dtype)


def _sample_impl(params, prompt_tokens, prompt_mask, key, *, cfg: ModelConfig,
                 sp: SamplingParams, group_size: int, shard_axes=None,
                 max_concurrent_rows: int | None = None, kv_cache_bytes: int | None = None,
                 dtype: str | None = None, refill_rows: int | None = None,
                 with_stats: bool = False, row_budget=None, context=None, images=None,
                 draft: speculative.Draft | None = None):
  """The sampler on one device's rows; ``shard_axes``: the mesh axes it runs under (shard_map);
  ``context``: each row's KV cache striped over a mesh axis (``_sample_rows``).
  ``with_stats``: also return ``{"slots", "computed"}``, the rows decoded at a time and the
  token slots computed (benchmarks: slot utilisation = tokens / computed). ``row_budget``: [B]
  int, an optional per-row cap on the completion length below ``T`` (rows reaching it end,
  flagged truncated): the long-tail benchmark's stop rule. ``images``: the prompts' images
  (``multimodal.RowImages``): the tower runs once per prompt, before the rows are chunked, the
  prompts prefill its merged embeddings at their M-RoPE positions, and the record carries them
  (``extras['images']``, repeated like the prompts) for the scoring and update forwards.
  ``draft``: speculative decoding (``rljax.rollout.spec_decode``; its stats add ``verifies`` and
  ``accepted``)."""
  chex.assert_rank([prompt_tokens, prompt_mask], 2)
  chex.assert_equal_shape([prompt_tokens, prompt_mask])
  if group_size < 1:
    raise ValueError(f"group_size must be >= 1, got {group_size}")
  cfg = sampler_config(cfg, dtype)
  stop_ids = resolve_stop_ids(sp, cfg)
  n_prompts, p = prompt_tokens.shape
  g, t_max = group_size, sp.max_new_tokens
  b = n_prompts * g
  # rollout.kv_cache_bytes counts a verification's positions past the last token emitted too.
  extra_positions = speculative.verify_positions(draft)
  slots = slot_budget(cfg, b, p, t_max + extra_positions, max_concurrent_rows, kv_cache_bytes)

  row_offset = 0
  if shard_axes is not None:  # this shard's first row in the whole batch
    row_offset = jax.lax.axis_index(shard_axes) * b
  # Token t draws with fold_in(key, t); threefry keys are folded for every t up front.
  step_keys = jax.vmap(lambda t: jax.random.fold_in(key, t))(jnp.arange(t_max))
  if noise.is_threefry(key):
    step_keys = noise.key_data(step_keys)

  prompt_tokens = prompt_tokens.astype(jnp.int32)
  prompt_mask = prompt_mask.astype(jnp.int32)
  cfg, weights = decode.inference_weights(cfg, params, p + t_max + extra_positions)  # once
  if draft is not None:
    spec_refusal(draft, context, images)
  vision_in = None
  if images is not None:
    if slots < b or context is not None:
      raise ValueError("prompts with images sample all rows at once: no continuous batching "
                       "(rollout.max_concurrent_rows / kv_cache_bytes) or mesh.context yet")
    model = transformer.bind(cfg, weights["params"])
    embeds, deepstack = multimodal.row_embeddings(cfg, model, prompt_tokens, images)
    vision_in = (embeds, jnp.asarray(images.positions, jnp.int32),  # [Pn, 3, P]
                 deepstack)  # [Pn, K, P, D] (Qwen3-VL) or None
  if slots < b and context is not None:
    raise ValueError(f"rollout.max_concurrent_rows / rollout.kv_cache_bytes cap a shard's {b} "
                     f"rows at {slots}: continuous batching's cache is not split over "
                     f"mesh.context={context.size}; lift the caps (the striped cache already "
                     "holds 1/context of each row)")
  if slots < b:
    return _continuous(weights, prompt_tokens, prompt_mask, row_offset, step_keys, row_budget,
                       cfg=cfg, sp=sp, stop_ids=stop_ids, g=g, slots=slots,
                       refill_rows=refill_rows, with_stats=with_stats, key=key, draft=draft)

  if row_budget is None:
    row_budget = jnp.full((b,), t_max, jnp.int32)
  if draft is None:
    plain = functools.partial(_sample_rows, weights, key_at=lambda t: step_keys[t], cfg=cfg,
                              sp=sp, stop_ids=stop_ids, g=g, context=context)
    rows = lambda *a: (plain(*a), {})
  else:
    spec = functools.partial(spec_decode.spec_rows, weights, key=key,
                             key_at=lambda t: step_keys[t], cfg=cfg, sp=sp, stop_ids=stop_ids,
                             g=g, draft=draft)
    rows = lambda tokens, mask, offset, budget, vision: spec(tokens, mask, offset, budget)
  pc = prompts_per_chunk(cfg, n_prompts, p, g, t_max)
  if pc == n_prompts:
    out, row_stats = rows(prompt_tokens, prompt_mask, row_offset, row_budget, vision_in)
  else:
    n_chunks = n_prompts // pc
    by_chunk = lambda x: None if x is None else x.reshape((n_chunks, pc) + x.shape[1:])
    chunked = jax.lax.map(
        lambda xs: rows(xs[0], xs[1], row_offset + xs[2] * (pc * g), xs[3], xs[4]),
        (by_chunk(prompt_tokens), by_chunk(prompt_mask), jnp.arange(n_chunks),
         row_budget.reshape(n_chunks, pc * g), jax.tree.map(by_chunk, vision_in)))
    out, row_stats = jax.tree.map(lambda x: x.reshape((b,) + x.shape[2:]), chunked)
  # All rows of a chunk at once: every step computes all of them until the last one stops.
  if images is not None:
    out = out.replace(extras={**out.extras, "images": jax.tree.map(
        lambda x: jnp.repeat(jnp.asarray(x), g, axis=0), images)})
  chunk_rows = pc * g
  computed = jnp.sum(jnp.max(out.lengths.reshape(-1, chunk_rows), axis=1)) * chunk_rows
  stats = dict(slots=chunk_rows, computed=computed,
               **{name: jnp.sum(v) for name, v in row_stats.items()})
  return (out, stats) if with_stats else out


def spec_refusal(draft: speculative.Draft, context, images=None) -> None:
  """Raise (one line) where speculative decoding is not built: a cache striped over a context
  axis, prompts with images (the verification's positions are 1-D)."""
  if images is not None:
    raise ValueError(f"rollout.draft={draft.kind!r} with prompts with images is not supported "
                     "yet (M-RoPE positions in the verification); set rollout.draft='none'")
  if context is not None:
    raise ValueError(f"rollout.draft={draft.kind!r} needs each row's KV cache on one device: "
                     f"mesh.context={context.size} stripes it; set rollout.draft='none'")


def continuous_chunks(cfg: ModelConfig, n_prompts: int, g: int, slots: int, t_slots: int) -> int:
  """Sequential chunks of the rows for continuous batching (a divisor of ``n_prompts``), each
  with ``slots // chunks`` slots: on CPU, small models (``CPU_CHUNK_MAX_WEIGHT_BYTES``) split
  the slots so that a chunk's cache of ``t_slots`` per row stays near ``CPU_CHUNK_BYTES``, as
  ``prompts_per_chunk`` does for the all-rows loop, while a chunk keeps at least
  ``CPU_MIN_CHUNK_SLOTS`` slots; elsewhere one chunk."""
  if jax.default_backend() not in decode.CPU_TUNED_BACKENDS:
    return 1
  if cfg.num_params() * jnp.dtype(cfg.param_dtype).itemsize > CPU_CHUNK_MAX_WEIGHT_BYTES:
    return 1
  per_row = _cache_bytes_per_row(cfg, t_slots)
  fits = [d for d in range(1, n_prompts + 1)
          if n_prompts % d == 0 and (d == 1 or slots // d >= CPU_MIN_CHUNK_SLOTS)]
  small = [d for d in fits if (slots // d) * per_row <= CPU_CHUNK_BYTES]
  return small[0] if small else fits[-1]


def _continuous(weights, prompt_tokens, prompt_mask, row_offset, step_keys, row_budget, *,
                cfg: ModelConfig, sp: SamplingParams, stop_ids: tuple, g: int, slots: int,
                refill_rows, with_stats: bool, key=None, draft=None):
  """``continuous.decode_rows`` over the rows, in sequential chunks (``continuous_chunks``),
  speculatively with ``draft`` (``key``: the rollout's key)."""
  n_prompts, p = prompt_tokens.shape
  t_max, b = sp.max_new_tokens, n_prompts * g
  n_chunks = continuous_chunks(cfg, n_prompts, g, slots, p + t_max)
  chunk_slots = slots // n_chunks
  budget = jnp.full((b,), t_max, jnp.int32) if row_budget is None else row_budget
  run = lambda pt, pm, offset, bud: continuous.decode_rows(
      weights, pt, pm, offset, step_keys, cfg=cfg, sp=sp, stop_ids=stop_ids, g=g,
      slots=chunk_slots, row_budget=bud,
      refill_rows=min(refill_rows or continuous.default_refill_rows(chunk_slots), chunk_slots),
      key=key, draft=draft)
  if n_chunks == 1:
    res = run(prompt_tokens, prompt_mask, row_offset, budget)
  else:
    rows_per_chunk = b // n_chunks
    res = jax.lax.map(
        lambda xs: run(xs[0], xs[1], row_offset + xs[2] * rows_per_chunk, xs[3]),
        (prompt_tokens.reshape(n_chunks, -1, p), prompt_mask.reshape(n_chunks, -1, p),
         jnp.arange(n_chunks), budget.reshape(n_chunks, -1)))
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    res = ([flat(x) for x in res[:5]] + [jnp.sum(res[5])]
           + [jax.tree.map(flat, x) for x in res[6:]])
  tokens, slp, dlp, length, stopped, computed, routes, row_stats = res
  rep = lambda x: jnp.repeat(x, g, axis=0) if g > 1 else x
  mask = (jnp.arange(t_max)[None, :] < length[:, None]).astype(jnp.int32)
  extras = {}
  if routes is not None:
    extras["sampler_routes"] = with_prompt_routes(rep(routes[0]), routes[1], mask)
  if row_stats:  # the per-row acceptance counts the trainer logs
    extras.update({speculative.STAT_VERIFIES: row_stats["verifies"],
                   speculative.STAT_ACCEPTED: row_stats["accepted"]})
  out = Rollout(prompt_tokens=rep(prompt_tokens), prompt_mask=rep(prompt_mask), tokens=tokens,
                mask=mask, sampler_logp=slp, draw_logp=dlp, lengths=length,
                truncated=~stopped, extras=extras)
  stats = dict(slots=chunk_slots, computed=computed,
               **{name: jnp.sum(v) for name, v in row_stats.items()})
  return (out, stats) if with_stats else out


def _sample_rows(weights, prompt_tokens, prompt_mask, row_offset, budget, vision_in=None, *,
                 key_at, cfg: ModelConfig, sp: SamplingParams, stop_ids: tuple, g: int,
                 context=None) -> Rollout:
  """Prefill ``Pn`` prompts and decode ``G`` completions of each (rows ``row_offset ..`` of the
  whole batch, which picks their noise); row ``i`` ends after ``budget[i]`` tokens at most.

  ``context`` (N devices on a mesh axis this runs manual over; ``rljax.parallel.context.
  Context``, taken as data): the cache is striped (slot j on device j mod N): the prompts are
  left-padded to a multiple of N slots, each device prefills its stripe and holds 1/N of every
  row's slots (the slot counts below are the row's), and every decode step's attention is the
  devices' partial attention combined (``context.cache_attend``). ``vision_in``: (embeddings
  [Pn, P, D], M-RoPE positions [Pn, 3, P], DeepStack additions [Pn, K, P, D] or None) of
  prompts with images, prefilled instead of the tokens' (``_sample_impl``)."""
  n = 1 if context is None else context.size
  prompt_out = (prompt_tokens, prompt_mask)  # the rollout's prompts, as they came
  extra = -prompt_tokens.shape[1] % n
  if extra:
    prompt_tokens, prompt_mask = (jnp.pad(x, ((0, 0), (extra, 0))) for x in prompt_out)
  n_prompts, p = prompt_tokens.shape
  t_max = sp.max_new_tokens
  b = n_prompts * g
  segments = [(a, e, k + -k % n) for a, e, k in _segments(p, t_max)]
  # Prefill the distinct prompts once, straight into a cache as large as the first segment needs.
  embeds = deepstack = None
  if vision_in is None:
    positions = transformer.positions_from_mask(prompt_mask)
  else:
    embeds, positions = vision_in[0], jnp.moveaxis(vision_in[1], 1, 0)  # [3, Pn, P]
    deepstack = None if vision_in[2] is None else jnp.moveaxis(vision_in[2], 1, 0)
  first_slots = segments[0][2] if segments else p
  cache = kv_cache.init_cache(cfg, n_prompts, first_slots // n)
  kv_valid = jnp.pad(prompt_mask.astype(bool), ((0, 0), (0, first_slots - p)))
  if context is None:
    # Gemma 3: an image's tokens see each other both ways in the prefill (decoding is causal).
    attend = None if vision_in is None else multimodal.prefill_attend(cfg, prompt_tokens,
                                                                       kv_valid)
    hidden, cache, prompt_routes = decode.step(cfg, weights, prompt_tokens, positions,
                                               cache, 0, kv_valid, attend=attend, embeds=embeds,
                                               deepstack=deepstack)
  else:
    hidden, cache, prompt_routes = decode.step(
        cfg, weights, context.stripe(prompt_tokens), context.stripe(positions), cache, 0,
        kv_valid, attend=context.cache_attend(cfg, 0, kv_valid, p // n))
    hidden = context.from_last(hidden)  # slot P-1 is the last device's
    if prompt_routes is not None:
      prompt_routes = context.gather(prompt_routes)
  if prompt_routes is not None:
    prompt_routes = prompt_routes[:, extra:]
  head = lambda h: logits_of(cfg, weights, h)
  last_logits = head(hidden)  # [Pn, V]

  # Group sampling: repeat prompt rows (and their cache) G times, groups contiguous.
  rep = lambda x: jnp.repeat(x, g, axis=0) if g > 1 else x
  prompt_mask_b = rep(prompt_mask)
  cache = jax.tree.map(rep, cache)
  last_logits = rep(last_logits)
  # [B] position of the first completion token: after the prompt's largest (M-RoPE: an image
  # advances the text positions by its side, not by its token count).
  next_pos = rep(positions[:, -1] if vision_in is None else positions.max(axis=(0, 2))) + 1

  stop_arr = jnp.asarray(stop_ids or (-1,), jnp.int32)
  pad = jnp.int32(sp.pad_id)
  own_slogp = not (sp.is_greedy or _is_identity(sp, cfg.vocab_size))

  def record(state, t, logits):
    """Sample token t from logits [B, V] and write it (padding for rows already stopped)."""
    tokens, logp, slogp, done, length = state
    tok, lp, slp = pick_tokens(logits, key_at(t), sp, row_offset)
    live = ~done & (t < budget)
    col = lambda x, v: jax.lax.dynamic_update_slice_in_dim(x, v[:, None], t, axis=1)
    tokens = col(tokens, jnp.where(live, tok, pad))
    logp = col(logp, jnp.where(live, lp, 0.0))
    if own_slogp:  # otherwise 0 (greedy) or the policy's (no transform): filled in at the end
      slogp = col(slogp, jnp.where(live, slp, 0.0))
    length = length + live.astype(jnp.int32)
    if stop_ids:
      done = done | (live & jnp.any(tok[:, None] == stop_arr[None, :], axis=-1))
    return (tokens, logp, slogp, done, length), tok

  out = (jnp.full((b, t_max), pad, jnp.int32), jnp.zeros((b, t_max), jnp.float32),
         jnp.zeros((b, t_max), jnp.float32), jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32))
  out, tok = record(out, 0, last_logits)
  # The experts of every fed token (MoE): token t is fed, and routed, at decode step t + 1.
  routes = None if prompt_routes is None else jnp.zeros((b, t_max) + prompt_routes.shape[2:],
                                                          jnp.int32)

  for first, end, slots in segments:
    cache = _grow_cache(cache, slots // n)
    kv_valid = jnp.concatenate([prompt_mask_b.astype(bool), jnp.ones((b, slots - p), bool)], 1)

    def cond(carry, end=end):
      t, _, _, out, _ = carry
      return (t < end) & ~jnp.all(out[3] | (budget <= t))

    def body(carry, kv_valid=kv_valid):
      t, cache, tok, out, routes = carry
      # Feed token t-1 at slot P+t-1 (position next_pos + t-1) and sample token t.
      attend = None if context is None else context.cache_attend(cfg, p + t - 1, kv_valid, 1)
      hidden, cache, step_routes = decode.step(cfg, weights, tok[:, None],
                                               (next_pos + t - 1)[:, None], cache, p + t - 1,
                                               kv_valid, attend)
      if routes is not None:
        routes = jax.lax.dynamic_update_slice_in_dim(routes, step_routes, t - 1, axis=1)
      out, tok = record(out, t, head(hidden))
      return t + 1, cache, tok, out, routes

    _, cache, tok, out, routes = jax.lax.while_loop(
        cond, body, (jnp.int32(first), cache, tok, out, routes))

  tokens, logp, slogp, done, length = out
  if not own_slogp:
    slogp = jnp.zeros_like(logp) if sp.is_greedy else logp
  mask = (jnp.arange(t_max)[None, :] < length[:, None]).astype(jnp.int32)
  extras = {}
  if routes is not None:
    extras["sampler_routes"] = with_prompt_routes(rep(prompt_routes), routes, mask)
  return Rollout(prompt_tokens=rep(prompt_out[0]), prompt_mask=rep(prompt_out[1]), tokens=tokens,
                 mask=mask, sampler_logp=logp, draw_logp=slogp, lengths=length,
                 truncated=~done, extras=extras)


def with_prompt_routes(prompt_routes, completion_routes, mask):
  """``extras['sampler_routes']`` [B, P + T, L_moe, k]: the experts of every position, 0 where
  no token was fed (padding, and the last sampled token, which no later token reads)."""
  fed = jnp.pad(mask[:, 1:], ((0, 0), (0, 1)))[:, :, None, None]  # token t+1 exists: t was fed
  return jnp.concatenate([prompt_routes, completion_routes * fed], axis=1)


_ENGINE_ARGS = ("max_concurrent_rows", "kv_cache_bytes", "dtype", "refill_rows", "draft")
_sample_jit = jax.jit(_sample_impl,
                      static_argnames=("cfg", "sp", "group_size", "with_stats") + _ENGINE_ARGS)


def sample(cfg: ModelConfig, params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array,
           key: jax.Array, sp: SamplingParams, group_size: int = 1, *,
           max_concurrent_rows: int | None = None, kv_cache_bytes: int | None = None,
           dtype: str | None = None, refill_rows: int | None = None,
           images: multimodal.RowImages | None = None,
           draft: speculative.Draft | None = None) -> Rollout:
  """Sample ``group_size`` completions for each of ``Pn`` left-padded prompts (jitted).

  Args:
    cfg: the model's config (static).
    params: the policy's parameter pytree (``transformer.init_params`` / ``load_hf`` layout).
    prompt_tokens: [Pn, P] int, left-padded; each row must hold at least one real token.
    prompt_mask: [Pn, P], 1 on real tokens.
    key: a ``jax.random`` key; all randomness comes from it.
    sp: ``SamplingParams`` (static). ``sp.stop_ids=None`` stops at ``cfg.eos_token_id``.
    group_size: ``G`` (static); the result has ``B = Pn * G`` rows, groups contiguous.
    max_concurrent_rows: the slot budget ``S``: at most this many rows decode at a time
      (continuous batching when ``B > S``); None or 0: all rows at once.
    kv_cache_bytes: a KV-cache budget in bytes that caps ``S`` too (rows of ``P + T`` slots in
      the sampler's dtype); None or 0: no cap.
    dtype: the sampler's compute dtype (weights, activations and KV cache), e.g. "bfloat16";
      None: the model's ``cfg.dtype``. Logits and log-probs stay float32.
    refill_rows: rows per refill of freed slots (continuous batching); None: ``S // 8``.
    images: the prompts' images (``multimodal.row_images``; a vision-language model): the
      tower runs once per prompt and the group shares the prefilled cache.
    draft: speculative decoding (``rljax.rollout.speculative.Draft``); None: off. The rollout
      follows the same distribution (greedy: the same tokens) with the same log-probs.

  Returns:
    A ``Rollout`` with ``T = sp.max_new_tokens`` completion slots per row.

  One compilation per distinct ``(cfg, sp, group_size, Pn, P)`` and engine setting, however the
  arguments are passed (positionally or by keyword).
  """
  return _sample_jit(params, prompt_tokens, prompt_mask, key, cfg=cfg, sp=sp,
                     group_size=int(group_size), max_concurrent_rows=max_concurrent_rows or None,
                     kv_cache_bytes=kv_cache_bytes or None, dtype=dtype,
                     refill_rows=refill_rows or None, images=images, draft=draft)


def make_sampler(cfg: ModelConfig, sp: SamplingParams, group_size: int = 1, mesh=None,
                 data_axis: str | Sequence[str] = ("data",), param_sharding=None, *,
                 max_concurrent_rows: int | None = None, kv_cache_bytes: int | None = None,
                 dtype: str | None = None, refill_rows: int | None = None, context=None,
                 draft: speculative.Draft | None = None):
  """A jitted ``fn(params, prompt_tokens, prompt_mask, key, images=None) -> Rollout`` for fixed
  cfg / sp / G (``images``: the prompts' ``multimodal.RowImages``, split over the shards like the
  prompts).

  Without a mesh this is ``sample`` with the static arguments bound. With a mesh, decoding is
  data parallel: ``shard_map`` over ``data_axis`` gives every shard its own prompts (``Pn`` must
  divide evenly) and its own decode loop, which stops when *its* rows are done; there is no
  collective inside the loop. Prompts and every ``[B, ...]`` output are sharded along
  ``data_axis`` (a group never straddles shards), the key is replicated, and params are taken
  replicated (``param_sharding``, e.g. from the partition rules, says how they arrive; they are
  gathered once per call). Other mesh axes hold replicas of the computation. The result equals
  the unsharded ``sample`` for threefry keys (noise is indexed by the global row).
  ``max_concurrent_rows`` and ``kv_cache_bytes`` are per shard (one decode loop each); see
  ``sample`` for them and ``dtype``.

  On a multi-core CPU host, ``XLA_FLAGS=--xla_force_host_platform_device_count=<cores>`` and a
  mesh over those devices run one decode loop per core.

  ``context`` (``rljax.parallel.context.Context`` of the mesh's context axis, or None): each
  row's KV cache is striped over that axis: the N devices of a data shard prefill a stripe of
  the prompts each, hold 1/N of every row's slots, and combine their partial attention by
  log-sum-exp in every decode step (the same tokens come out of all N).

  ``draft``: speculative decoding (``sample``), each data shard verifying its own rows.
  """
  engine = dict(max_concurrent_rows=max_concurrent_rows or None,
                kv_cache_bytes=kv_cache_bytes or None, dtype=dtype, refill_rows=refill_rows or None,
                draft=draft)
  if mesh is None:
    return jax.jit(functools.partial(_sample_impl, cfg=cfg, sp=sp, group_size=group_size,
                                     **engine))
  axes = (data_axis,) if isinstance(data_axis, str) else tuple(data_axis)
  n_shards = int(np.prod([mesh.shape[a] for a in axes]))
  spec = PartitionSpec(axes)
  local = functools.partial(_sample_impl, cfg=cfg, sp=sp, group_size=group_size,
                            shard_axes=axes, context=context, **engine)
  replicated = NamedSharding(mesh, PartitionSpec())
  batch = NamedSharding(mesh, spec)

  def compiled(with_images: bool):
    """The sharded sampler; with images, they come as a fifth argument split by rows."""
    body = (lambda p, t, m, i, k: local(p, t, m, k, images=i)) if with_images else local
    rows_in = 3 if with_images else 2
    mapped = jax.shard_map(body, mesh=mesh, in_specs=(PartitionSpec(),) + (spec,) * rows_in
                           + (PartitionSpec(),), out_specs=spec, check_vma=False)
    return jax.jit(mapped, in_shardings=(param_sharding or replicated,) + (batch,) * rows_in
                   + (replicated,), out_shardings=batch)

  jitted, with_images = compiled(False), functools.lru_cache(1)(lambda: compiled(True))

  def fn(params, prompt_tokens, prompt_mask, key, images=None):
    if prompt_tokens.shape[0] % n_shards:
      raise ValueError(f"{prompt_tokens.shape[0]} prompts do not split evenly over the "
                       f"{n_shards} shards of mesh axes {axes}")
    if images is not None:
      return with_images()(params, prompt_tokens, prompt_mask, images, key)
    return jitted(params, prompt_tokens, prompt_mask, key)

  fn.jitted = jitted
  return fn

"""Continuous batching inside the compiled decode loop: ``S`` cache slots serve ``B > S`` rows.

Today's loop (``sampler._sample_rows``) decodes every row of a call together until the last one
stops, so with long-tailed completion lengths most of its steps compute rows that have already
stopped, and its cache holds ``P + T`` slots for every row. Here the cache holds ``S`` rows
(``slots``); rows enter in their original order, and when a row stops its slot takes the next
pending row (the scheme of Orca, Yu et al. 2022, "iteration-level scheduling", run inside one
``lax.while_loop``):

1. The ``Pn`` distinct prompts are prefilled once, up front (one batched ``decode.step`` with
   ``S = P``): their KV ``[Pn, G, P, Dh]`` and last hidden state stay aside, so a prompt's prefill
   is shared by all its ``G`` completions whenever they run.
2. *Refill*: the first ``R`` free slots take the next ``R`` pending rows: the row's prompt KV is
   copied into the slot's region ``[0, P)``, its first token is drawn from the prompt's last
   hidden state, and the slot's completion region ``[P, P + T)`` starts empty (masked). The loop
   refills when at least ``min(R, pending rows)`` slots are free, so copies go in batches of
   ``R`` (``refill_rows``) instead of one per freed slot.
3. *Decode*: one ``decode.step`` (``S = 1``) for all ``S`` slots, each writing its key/value at
   its own slot ``P + t - 1`` and attending to its prompt and its own ``t`` completion tokens.
   The cache is kept in blocks (``kv_blocks``): a step reads the prompt block and only the
   completion blocks that the deepest active slot has reached, not every slot's ``P + T``.
4. *Drain*: once no row is pending, the loop narrows to ``S/2, S/4, S/8`` slots (the active rows
   compacted into the first ones) whenever they fit, so that the last long rows do not keep all
   ``S`` slots computing.

Randomness does not depend on slots or steps: the token ``t`` of batch row ``r`` is drawn with
``fold_in(key, t)`` at the noise counters of row ``r``, exactly as the all-rows loop draws it, so
both loops give the same rollout (the tests check it) and the result does not depend on ``S``.

Speculative decoding (``draft``; ``rljax.rollout.spec_decode``): step 3 instead drafts ``k``
tokens per slot and verifies them in one ``decode.step`` of ``k + 1`` tokens for all ``S`` slots
(each slot writes ``k + 1`` keys from its own position and each query attends up to its own:
``kv_blocks.attend`` with ``Sq = k + 1``); a slot advances by the tokens it emits, between 1 and
``k + 1``, and frees when its row stops. A row's verification ``i`` draws its noise from
``fold_in(key, T + i)`` at the row's counters (``spec_decode.iteration_noise``), as the all-rows
speculative loop does, so the two give the same rollout whatever ``S``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.models import kv_cache, transformer
from rljax.models.config import ModelConfig
from rljax.rollout import decode, kv_blocks, spec_decode, speculative
from rljax.rollout.sampling import SamplingParams, _is_identity, pick_tokens_rows


def default_refill_rows(slots: int) -> int:
  """Rows per refill: an eighth of the slots (a freed slot then waits for about 1/16 of a
  row's decode on average, see docs/rollout.md), at least one."""
  return max(1, slots // 8)


def drain_widths(slots: int, phases: int = 4) -> list[int]:
  """Slot counts of the loop's phases: ``S``, then ``S/2, S/4, S/8`` once no row is pending and
  few enough rows are left (the drain)."""
  return sorted({max(1, slots >> k) for k in range(phases)}, reverse=True)


def decode_rows(weights, prompt_tokens, prompt_mask, row_offset, step_keys, *, cfg: ModelConfig,
                sp: SamplingParams, stop_ids: tuple, g: int, slots: int, refill_rows: int,
                row_budget=None, block_slots: int | None = None, key=None,
                draft: speculative.Draft | None = None):
  """Prefill ``Pn`` prompts, decode their ``B = Pn * G`` completions through ``slots`` cache slots.

  step_keys: [T, ...] the key of token ``t`` (threefry key words [T, 2] or typed keys [T]).
  row_offset: this shard's first row in the whole batch (it picks the rows' noise).
  row_budget: None, or [B] int per-row caps on the completion length (at most ``T``).
  block_slots: completion positions per cache block; None: ``kv_blocks.BLOCK_SLOTS``.
  draft: speculative decoding (None: off); ``key`` the rollout's key, its verifications' noise.
  Returns ``(tokens, sampler_logp, draw_logp [B, T], lengths [B], stopped [B], computed,
  routes, row_stats)``: rows in their original order, ``stopped`` True for rows that emitted a
  stop token, ``computed`` the token slots computed (each row's first token, then the loop's
  width per decode step, ``k + 1`` per slot when verifying), ``routes`` None or (MoE) ``(prompt
  routes [Pn, P, L_moe, k], completion routes [B, T, L_moe, k])``, the experts of every fed token
  (not recorded under speculation), ``row_stats`` {} or, with a draft, ``{'verifies',
  'accepted'}`` [B]: each row's verification forwards and drafted tokens accepted.
  """
  n_prompts, p = prompt_tokens.shape
  t_max = sp.max_new_tokens
  b = n_prompts * g
  if not 1 <= slots < b or not 1 <= refill_rows <= slots:
    raise ValueError(f"continuous batching needs 1 <= slots < rows and 1 <= refill_rows <= slots,"
                     f" got slots={slots}, rows={b}, refill_rows={refill_rows}")
  positions = transformer.positions_from_mask(prompt_mask)
  pcache = kv_cache.init_cache(cfg, n_prompts, p)
  prompt_hidden, pcache, prompt_routes = decode.step(cfg, weights, prompt_tokens,
                                                     positions, pcache, 0,
                                                     prompt_mask.astype(bool))
  first_pos = positions[:, -1] + 1  # [Pn] position of the first completion token
  stop_arr = jnp.asarray(stop_ids or (-1,), jnp.int32)
  is_stop = lambda tok: (jnp.any(tok[:, None] == stop_arr[None, :], axis=-1) if stop_ids
                         else jnp.zeros(tok.shape, bool))
  budget = jnp.full((b,), t_max, jnp.int32) if row_budget is None else jnp.minimum(
      jnp.asarray(row_budget, jnp.int32), t_max)
  head = lambda h: transformer.softcap(cfg, jnp.dot(h, weights["head"],
                                                    preferred_element_type=jnp.float32))
  k = 0 if draft is None else draft.tokens
  # A verification writes k positions past the row's last token: the blocks hold T + k.
  sizes = kv_blocks.block_sizes(t_max + k, block_slots or kv_blocks.BLOCK_SLOTS)

  def refill(state, size: int):
    """The first ``min(size, free, pending)`` free slots take the next pending rows."""
    slot, out, next_row = state["slot"], state["out"], state["next_row"]
    free = ~slot["active"]
    n_take = jnp.minimum(jnp.minimum(jnp.sum(free), b - next_row), size)
    idx = jnp.nonzero(free, size=size, fill_value=slots)[0]  # [size] free slot indices
    taken = jnp.arange(size) < n_take
    idx = jnp.where(taken, idx, slots)  # out of range: dropped by the scatters below
    rows = jnp.where(taken, next_row + jnp.arange(size), b)
    prompt = jnp.minimum(rows, b - 1) // g
    cache = tuple(((ck.at[idx].set(pk[prompt], mode="drop"),
                    cv.at[idx].set(pv[prompt], mode="drop")), blocks)
                  for ((ck, cv), blocks), (pk, pv) in zip(state["cache"], pcache))
    keys = jnp.broadcast_to(step_keys[0], (size,) + step_keys.shape[1:])
    tok, lp, dlp = pick_tokens_rows(head(prompt_hidden[prompt]), keys, rows + row_offset, sp)
    stop = is_stop(tok)
    out = dict(out, tokens=out["tokens"].at[rows, 0].set(tok, mode="drop"),
               sampler_logp=out["sampler_logp"].at[rows, 0].set(lp, mode="drop"),
               draw_logp=out["draw_logp"].at[rows, 0].set(dlp, mode="drop"),
               lengths=out["lengths"].at[rows].set(1, mode="drop"),
               stopped=out["stopped"].at[rows].set(stop, mode="drop"))
    put = lambda x, v: x.at[idx].set(v, mode="drop")
    slot = dict(row=put(slot["row"], rows), t=put(slot["t"], jnp.ones_like(rows)),
                it=put(slot["it"], jnp.zeros_like(rows)),
                tok=put(slot["tok"], tok),
                active=put(slot["active"], ~stop & (budget[jnp.minimum(rows, b - 1)] > 1)),
                pos0=put(slot["pos0"], first_pos[prompt]),
                prompt_mask=put(slot["prompt_mask"], prompt_mask[prompt].astype(bool)))
    return dict(state, cache=cache, slot=slot, out=out, next_row=next_row + n_take)

  def decode_step(state):
    """Feed every slot's last token at its own cache slot ``P + t - 1``; draw token ``t``."""
    slot, out = state["slot"], state["out"]
    t, live = slot["t"], slot["active"]
    attend = functools.partial(
        kv_blocks.attend, t=t, prompt_valid=slot["prompt_mask"], sizes=sizes,
        n_blocks=kv_blocks.blocks_needed(jnp.max(jnp.where(live, t, 1)), sizes))
    hidden, cache, routes = decode.step(cfg, weights, slot["tok"][:, None],
                                (slot["pos0"] + t - 1)[:, None], state["cache"], None, None,
                                attend=attend)
    t_draw = jnp.minimum(t, t_max - 1)
    tok, lp, dlp = pick_tokens_rows(head(hidden), step_keys[t_draw], slot["row"] + row_offset, sp)
    rows = jnp.where(live, slot["row"], b)  # finished and empty slots write nothing
    stop = is_stop(tok)
    out = dict(out, tokens=out["tokens"].at[rows, t_draw].set(tok, mode="drop"),
               sampler_logp=out["sampler_logp"].at[rows, t_draw].set(lp, mode="drop"),
               draw_logp=out["draw_logp"].at[rows, t_draw].set(dlp, mode="drop"),
               lengths=out["lengths"].at[rows].add(1, mode="drop"),
               stopped=out["stopped"].at[rows].set(stop, mode="drop"))
    if routes is not None:  # the fed token, completion position t - 1, went to these experts
      out["routes"] = out["routes"].at[rows, t - 1].set(routes[:, 0], mode="drop")
    slot = dict(slot, t=t + live, tok=jnp.where(live, tok, slot["tok"]),
                active=live & ~stop & (t + 1 < budget[jnp.minimum(slot["row"], b - 1)]))
    return dict(state, cache=cache, slot=slot, out=out, computed=state["computed"] + t.shape[0])

  if draft is not None:
    identity = _is_identity(sp, cfg.vocab_size)
    if draft.kind == "layers":
      draft_cfg, draft_weights = spec_decode.first_layers(cfg, weights, draft.layers)

  def spec_step(state):
    """Draft ``k`` tokens per slot after its last one (not yet fed) and verify them in one
    forward of ``k + 1`` tokens at the slot's own positions; emit what the target accepts."""
    slot, out = state["slot"], state["out"]
    t, live = slot["t"], slot["active"]
    row = jnp.minimum(slot["row"], b - 1)
    blocks = kv_blocks.blocks_needed(jnp.max(jnp.where(live, t, 1)) + k, sizes)
    attend_at = lambda first: functools.partial(
        kv_blocks.attend, t=first, prompt_valid=slot["prompt_mask"], sizes=sizes,
        n_blocks=blocks)
    draft_g, final_g, uniforms = (None,) * 3 if sp.is_greedy else spec_decode.iteration_noise(
        key, slot["it"], row + row_offset, t_max=t_max, vocab=cfg.vocab_size, draft=draft)
    cache, q = state["cache"], None
    if draft.kind == "ngram":
      d = spec_decode.propose_ngram(prompt_tokens[row // g], prompt_mask[row // g],
                                    out["tokens"][row], t, draft)
    else:
      def step(sub, j, tok):
        h, sub, _ = decode.step(draft_cfg, draft_weights, tok[:, None],
                                (slot["pos0"] + t - 1 + j)[:, None], sub, None, None,
                                attend=attend_at(t + j))
        return h, sub
      sub, d, q = spec_decode.propose_layers(
          step, cache[:draft.layers], slot["tok"], draft_g, k=k, sp=sp,
          logits=lambda h: decode.logits_of(draft_cfg, draft_weights, h))
      cache = tuple(sub) + tuple(cache[draft.layers:])
    feed = jnp.concatenate([slot["tok"][:, None], d], axis=1)
    pos = (slot["pos0"] + t - 1)[:, None] + jnp.arange(k + 1)[None]
    hidden, cache, _ = decode.step(cfg, weights, feed, pos, cache, None, None,
                                   attend=attend_at(t), all_positions=True)
    n, block, slp, dlp = spec_decode.judge(decode.logits_of(cfg, weights, hidden), d, q,
                                           final_g, uniforms, sp=sp, identity=identity)
    count, stop = speculative.emitted_count(block, n, budget[row] - t, stop_ids)
    count = jnp.where(live, count, 0)
    rows = jnp.where(live, slot["row"], b)  # finished and empty slots write nothing
    j = jnp.arange(k + 1)[None]
    cols = jnp.where(j < count[:, None], t[:, None] + j, t_max)  # past the count: dropped
    put = lambda x, v: x.at[rows[:, None], cols].set(v, mode="drop")
    out = dict(out, tokens=put(out["tokens"], block), sampler_logp=put(out["sampler_logp"], slp),
               draw_logp=put(out["draw_logp"], dlp),
               lengths=out["lengths"].at[rows].add(count, mode="drop"),
               stopped=out["stopped"].at[rows].set(stop, mode="drop"),
               verifies=out["verifies"].at[rows].add(1, mode="drop"),
               accepted=out["accepted"].at[rows].add(n, mode="drop"))
    last = jnp.take_along_axis(block, jnp.maximum(count - 1, 0)[:, None], axis=1)[:, 0]
    slot = dict(slot, t=t + count, it=slot["it"] + live,
                tok=jnp.where(count > 0, last, slot["tok"]),
                active=live & ~stop & (t + count < budget[row]))
    return dict(state, cache=cache, slot=slot, out=out,
                computed=state["computed"] + t.shape[0] * (k + 1))

  advance = decode_step if draft is None else spec_step

  def body(state):
    free = slots - jnp.sum(state["slot"]["active"])
    pending = b - state["next_row"]
    due = (pending > 0) & (free >= jnp.minimum(refill_rows, pending))
    state = jax.lax.cond(due, lambda s: refill(s, refill_rows), lambda s: s, state)
    return advance(state)

  def run_phase(state, first: bool, next_width: int):
    """Decode until no row is pending and at most ``next_width`` slots are active."""
    cond = lambda s: (s["next_row"] < b) | (jnp.sum(s["slot"]["active"]) > next_width)
    return jax.lax.while_loop(cond, body if first else advance, state)

  pad = jnp.int32(sp.pad_id)
  state = dict(
      cache=kv_blocks.init_cache(cfg, slots, p, sizes),
      slot=dict(row=jnp.full((slots,), b, jnp.int32), t=jnp.zeros((slots,), jnp.int32),
                it=jnp.zeros((slots,), jnp.int32),
                tok=jnp.zeros((slots,), jnp.int32), active=jnp.zeros((slots,), bool),
                pos0=jnp.zeros((slots,), jnp.int32),
                prompt_mask=jnp.zeros((slots, p), bool)),
      out=dict(tokens=jnp.full((b, t_max), pad, jnp.int32),
               sampler_logp=jnp.zeros((b, t_max), jnp.float32),
               draw_logp=jnp.zeros((b, t_max), jnp.float32),
               lengths=jnp.zeros((b,), jnp.int32), stopped=jnp.zeros((b,), bool),
               **({} if prompt_routes is None or draft is not None else
                  {"routes": jnp.zeros((b, t_max) + prompt_routes.shape[2:], jnp.int32)}),
               **({} if draft is None else {"verifies": jnp.zeros((b,), jnp.int32),
                                            "accepted": jnp.zeros((b,), jnp.int32)})),
      next_row=jnp.int32(0), computed=jnp.int32(b))
  state = refill(state, slots)  # every slot takes a row
  widths = drain_widths(slots)
  for i, width in enumerate(widths):
    if i:  # compact: the active slots move to the first ``width`` slots, the rest are dropped
      keep = jnp.argsort(~state["slot"]["active"])[:width]  # stable: active slots first
      state = dict(state, slot=jax.tree.map(lambda x: x[keep], state["slot"]),
                   cache=jax.tree.map(lambda x: x[keep], state["cache"]))
    state = run_phase(state, i == 0, widths[i + 1] if i + 1 < len(widths) else 0)
  o = state["out"]
  routes = None if "routes" not in o else (prompt_routes, o["routes"])
  row_stats = {} if draft is None else {"verifies": o["verifies"], "accepted": o["accepted"]}
  return (o["tokens"], o["sampler_logp"], o["draw_logp"], o["lengths"], o["stopped"],
          state["computed"], routes, row_stats)

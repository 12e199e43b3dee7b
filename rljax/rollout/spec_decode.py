"""The speculative decode loop: draft ``k`` tokens, verify them in one forward, emit what the
target's distribution accepts (``rljax.rollout.speculative`` holds the formulas and papers).

``spec_rows`` replaces the sampler's plain loop (``rljax.rollout.sampler._sample_rows``) when a
``Draft`` is set; everything around it (chunks of rows, sharding over data shards, the
``Rollout`` record) is the sampler's. Per row and iteration, with ``L`` tokens emitted so far and
the last one not yet fed:

1. draft ``d_1..d_k`` (prompt lookup over the row's context, or the policy's first ``m`` layers
   run ``k`` steps through the first ``m`` layers of the row's own KV cache);
2. feed ``[x_L, d_1..d_k]`` (``S = k + 1``) at the row's own slots ``P + L - 1 ..`` (each row at
   its own slot and position: rows advance by different amounts) and take the target's logits
   at every position;
3. accept ``n`` drafted tokens and draw one more (residual or bonus), cut at the row's budget and
   its first stop token; ``L`` advances by the tokens emitted.

Rejected positions are rolled back by not advancing: their cache slots lie past the row's length,
where no query looks (each query attends only up to its own slot) and the next verification
overwrites them. The recorded log-probs are those of the verification forward, i.e. of the
policy's forward over the emitted tokens (the plain sampler's, to float tolerance).

The cache grows in a few static segments as the plain loop's does; a segment runs while every
live row's next verification fits in it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import kv_cache, transformer
from rljax.models.config import ModelConfig
from rljax.rollout import decode, noise, speculative
from rljax.rollout.record import Rollout
from rljax.rollout.sampling import (SamplingParams, _argmax, _is_identity, pick_tokens,
                                    process_logits)

_SEGMENT_STEPS = 16
_MAX_SEGMENTS = 4


def segment_bounds(t_max: int) -> list[int]:
  """Completion lengths ``L`` up to which each cache segment serves (the last is ``T``); the
  segment ending at ``l`` holds ``P + l + k`` slots."""
  n = int(min(_MAX_SEGMENTS, max(1, round(t_max / _SEGMENT_STEPS))))
  bounds = sorted(set(np.linspace(0, t_max, n + 1).round().astype(int).tolist()))
  return [b for b in bounds if b > 0]


def first_layers(cfg: ModelConfig, weights: dict, m: int) -> tuple[ModelConfig, dict]:
  """``(cfg, weights)`` of the policy's first ``m`` layers with its final norm and head (the
  self-speculative draft); ``weights`` from ``decode.inference_weights``."""
  if not 1 <= m <= cfg.num_layers:  # m = L: the draft is the policy (every draft accepted)
    raise ValueError(f"rollout.draft_layers={m}: the draft's layers are the first of the "
                     f"policy's {cfg.num_layers}")
  keep = {k: v for k, v in weights["params"].items()
          if not k.startswith("layers_") or int(k[len("layers_"):]) < m}
  layer_types = None if cfg.layer_types is None else cfg.layer_types[:m]
  moe = tuple(i for i in cfg.moe_layers if i < m)
  return (cfg.replace(num_layers=m, layer_types=layer_types, moe_layers=moe),
          dict(weights, params=keep))


def _row(x, i):
  """``x[b, i[b]]`` for x [B, S, ...] and i [B]."""
  return jnp.take_along_axis(x, i.reshape((-1, 1) + (1,) * (x.ndim - 2)), axis=1)[:, 0]


def _at(x, tokens):
  """``x[b, s, tokens[b, s]]`` for x [B, S, V]."""
  return jnp.take_along_axis(x, tokens[..., None], axis=-1)[..., 0]


def drafted_draws(draft: speculative.Draft) -> int:
  """The draft's own categorical draws per verification: ``k`` for 'layers' (a stochastic
  draft), none for 'ngram' (a one-hot ``q`` draws nothing)."""
  return draft.tokens if draft.kind == "layers" else 0


def iteration_noise(key, its, rows, *, t_max: int, vocab: int, draft: speculative.Draft):
  """Each row's noise for its verification number ``its`` [B]: Gumbel [k', B, V] for the draft's
  draws (``drafted_draws``), [B, V] for the residual / bonus draw (a categorical draw is
  ``argmax(logits + gumbel)``), and uniforms [B, k] for the acceptance tests, from key
  ``fold_in(key, T + it)`` (the plain loop's token ``t`` uses ``fold_in(key, t)``) at the
  counters of the row's index ``rows`` [B] in the whole batch: a row draws the same whatever
  shard, slot or step verifies it (threefry; other RNGs fold the row index into the key)."""
  k, n_draft = draft.tokens, drafted_draws(draft)
  width = (n_draft + 1) * vocab + k
  kits = jax.vmap(lambda it: jax.random.fold_in(key, t_max + it))(its)
  if noise.is_threefry(key):
    g = noise.gumbel_rows(noise.key_data(kits), rows, width)
  else:
    g = jax.vmap(lambda kit, r: jax.random.gumbel(jax.random.fold_in(kit, r), (width,)))(kits,
                                                                                         rows)
  b = g.shape[0]
  draft_g = g[:, :n_draft * vocab].reshape(b, n_draft, vocab).transpose(1, 0, 2)
  final_g = g[:, n_draft * vocab:(n_draft + 1) * vocab]
  uniforms = jnp.exp(-jnp.exp(-g[:, (n_draft + 1) * vocab:]))  # the Gumbel's own uniform
  return draft_g, final_g, uniforms


def propose_ngram(prompt, prompt_mask, buf, length, draft: speculative.Draft):
  """Prompt lookup over each row's context: ``prompt`` [B, P] (``prompt_mask``) then its ``length``
  [B] tokens of ``buf`` [B, >= T]; the drafted tokens [B, k]."""
  p, t_max = prompt.shape[1], buf.shape[1]
  seq = jnp.concatenate([prompt, buf], axis=1)
  valid = jnp.concatenate([prompt_mask.astype(bool),
                           jnp.arange(t_max)[None] < length[:, None]], axis=1)
  d, _ = speculative.ngram_proposals(seq, valid, p + length - 1, draft.ngram, draft.tokens)
  return d


def propose_layers(step, sub, last, draft_g, *, k: int, sp: SamplingParams, logits):
  """The self-speculative draft: ``k`` steps of ``step(sub, j, tok) -> (hidden, sub)``, which
  feeds each row's ``j``-th draft input ``tok`` [B] through the draft's layers and their cache
  ``sub`` (the first layers of the policy's), ``logits(hidden)`` its head; ``draft_g`` [k, B, V]
  its draws' Gumbel noise (unused when greedy). Returns (``sub``, drafted [B, k], the draft's
  log-distributions [B, k, V] or None when greedy: its argmax is a one-hot ``q``)."""
  greedy = sp.is_greedy

  def one(carry, xs):
    (sub, tok), (j, g) = carry, xs
    h, sub = step(sub, j, tok)
    lg = logits(h)
    if greedy:
      return (sub, _argmax(lg)), (_argmax(lg), jnp.zeros((tok.shape[0], 0), jnp.float32))
    q = jax.nn.log_softmax(process_logits(lg, sp), axis=-1)
    d = _argmax(q + g)
    return (sub, d), (d, q)

  g = jnp.zeros((k, last.shape[0], 0), jnp.float32) if greedy else draft_g
  (sub, _), (d, q) = jax.lax.scan(one, (sub, last), (jnp.arange(k), g))
  return sub, d.T, None if greedy else q.transpose(1, 0, 2)


def judge(logits, d, q, final_g, uniforms, *, sp: SamplingParams, identity: bool):
  """The target's verdict on drafted ``d`` [B, k] (draft log-distributions ``q`` [B, k, V], None:
  one-hot) from its ``logits`` [B, k+1, V] at ``[x_L, d_1..d_k]``: (accepted ``n`` [B], the
  emitted block [B, k+1] (``speculative.emitted_block``), its policy and draw log-probs)."""
  b, k = d.shape
  raw = jax.nn.log_softmax(logits, axis=-1)
  if sp.is_greedy:  # p is the point mass on the argmax
    target = _argmax(logits)
    n = speculative.accepted_length((d == target[:, :k]).astype(jnp.float32),
                                    jnp.zeros((b, k), jnp.float32))
    block = speculative.emitted_block(d, n, _row(target, n))
    return n, block, _at(raw, block), jnp.zeros(block.shape, jnp.float32)
  plp = jax.nn.log_softmax(process_logits(logits, sp), axis=-1)
  p_d = _at(plp[:, :k], d)
  n = speculative.accepted_length(
      speculative.acceptance_probs(p_d, None if q is None else _at(q, d)), uniforms)
  j = jnp.minimum(n, k - 1)
  residual = speculative.residual_logits(_row(plp, j), None if q is None else _row(q, j),
                                         drafted=_row(d, j))
  final = jnp.where((n < k)[:, None], residual, _row(plp, n))
  block = speculative.emitted_block(d, n, _argmax(final + final_g))
  slp = _at(raw, block)
  return n, block, slp, slp if identity else _at(plp, block)


def spec_rows(weights, prompt_tokens, prompt_mask, row_offset, budget, *, key, key_at,
              cfg: ModelConfig, sp: SamplingParams, stop_ids: tuple, g: int,
              draft: speculative.Draft):
  """Prefill ``Pn`` prompts and decode ``G`` completions of each speculatively (the arguments of
  ``sampler._sample_rows``; ``key``: the rollout's key). Returns (``Rollout``, per-row stats
  ``{'verifies', 'accepted'}`` [B]: verification forwards and drafted tokens accepted)."""
  n_prompts, p = prompt_tokens.shape
  t_max, k = sp.max_new_tokens, draft.tokens
  b = n_prompts * g
  greedy = sp.is_greedy
  identity = _is_identity(sp, cfg.vocab_size)
  bounds = segment_bounds(t_max)
  positions = transformer.positions_from_mask(prompt_mask)
  slots0 = p + bounds[0] + k
  cache = kv_cache.init_cache(cfg, n_prompts, slots0)
  kv_valid = jnp.pad(prompt_mask.astype(bool), ((0, 0), (0, slots0 - p)))
  hidden, cache, _ = decode.step(cfg, weights, prompt_tokens, positions, cache, 0, kv_valid)
  rep = lambda x: jnp.repeat(x, g, axis=0) if g > 1 else x
  cache = jax.tree.map(rep, cache)
  prompt_b, prompt_mask_b = rep(prompt_tokens), rep(prompt_mask)
  next_pos = rep(positions[:, -1]) + 1

  # Token 0 as the plain sampler draws it.
  tok, slp0, dlp0 = pick_tokens(rep(decode.logits_of(cfg, weights, hidden)), key_at(0), sp,
                                row_offset)
  if greedy:
    dlp0 = jnp.zeros_like(slp0)
  live0 = budget > 0
  width = t_max + k + 1
  pad = jnp.int32(sp.pad_id)
  put0 = lambda x, v, fill: x.at[:, 0].set(jnp.where(live0, v, fill))
  buf = put0(jnp.full((b, width), pad, jnp.int32), tok, pad)
  slp = put0(jnp.zeros((b, width), jnp.float32), slp0, 0.0)
  dlp = put0(jnp.zeros((b, width), jnp.float32), dlp0, 0.0)
  length = live0.astype(jnp.int32)
  done = live0 & jnp.any(tok[:, None] == jnp.asarray(stop_ids or (-1,), jnp.int32), axis=-1) \
      if stop_ids else jnp.zeros((b,), bool)

  rows = row_offset + jnp.arange(b)
  noise_of = lambda it: iteration_noise(key, jnp.full((b,), it, jnp.int32), rows, t_max=t_max,
                                        vocab=cfg.vocab_size, draft=draft)

  if draft.kind == "layers":
    draft_cfg, draft_weights = first_layers(cfg, weights, draft.layers)

  def propose(cache, kv_valid, buf, length, last, draft_g):
    """(cache, drafted [B, k], the draft's log-distributions [B, k, V] or None: one-hot)."""
    if draft.kind == "ngram":
      return cache, propose_ngram(prompt_b, prompt_mask_b, buf[:, :t_max], length, draft), None
    m = draft.layers

    def step(sub, j, tok):
      h, sub, _ = decode.step(draft_cfg, draft_weights, tok[:, None],
                              (next_pos + length - 1 + j)[:, None], sub, p + length - 1 + j,
                              kv_valid)
      return h, sub
    sub, d, q = propose_layers(step, cache[:m], last, draft_g, k=k, sp=sp,
                               logits=lambda h: decode.logits_of(draft_cfg, draft_weights, h))
    return tuple(sub) + tuple(cache[m:]), d, q

  def verify(cache, kv_valid, length, last, d, q, final_g, uniforms):
    """(cache, accepted n [B], the emitted block [B, k+1], its policy and draw log-probs)."""
    feed = jnp.concatenate([last[:, None], d], axis=1)
    pos = (next_pos + length - 1)[:, None] + jnp.arange(k + 1)[None]
    h, cache, _ = decode.step(cfg, weights, feed, pos, cache, p + length - 1, kv_valid,
                              all_positions=True)
    return (cache,) + judge(decode.logits_of(cfg, weights, h), d, q, final_g, uniforms, sp=sp,
                            identity=identity)

  def write(x, values, length, count, fill):
    j = jnp.arange(k + 1)[None]
    values = jnp.where(j < count[:, None], values, fill).astype(x.dtype)
    return jax.vmap(lambda r, v, s: jax.lax.dynamic_update_slice(r, v, (s,)))(x, values, length)

  state = (jnp.int32(0), buf, slp, dlp, length, done, tok, jnp.zeros((b,), jnp.int32),
           jnp.zeros((b,), jnp.int32))
  for bound in bounds:
    slots = p + bound + k
    if cache[0][0].shape[2] < slots:
      cache = jax.tree.map(
          lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, slots - x.shape[2]), (0, 0))), cache)
    kv_valid = jnp.concatenate([prompt_mask_b.astype(bool), jnp.ones((b, slots - p), bool)], 1)

    def cond(carry, bound=bound):
      _, (_, _, _, _, length, done, _, _, _) = carry
      live = ~done & (length < budget)
      return jnp.any(live) & jnp.all(~live | (length <= bound))

    def body(carry, kv_valid=kv_valid):
      cache, (it, buf, slp, dlp, length, done, last, verifies, accepted) = carry
      live = ~done & (length < budget)
      draft_g, final_g, uniforms = (None,) * 3 if greedy else noise_of(it)  # greedy draws nothing
      cache, d, q = propose(cache, kv_valid, buf, length, last, draft_g)
      cache, n, block, b_slp, b_dlp = verify(cache, kv_valid, length, last, d, q, final_g,
                                             uniforms)
      count, stopped = speculative.emitted_count(block, n, budget - length, stop_ids)
      count = jnp.where(live, count, 0)
      buf = write(buf, block, length, count, pad)
      slp = write(slp, b_slp, length, count, 0.0)
      dlp = write(dlp, b_dlp, length, count, 0.0)
      last = jnp.where(count > 0, _row(block, jnp.maximum(count - 1, 0)), last)
      return cache, (it + 1, buf, slp, dlp, length + count, done | (live & stopped), last,
                     verifies + live, accepted + jnp.where(live, n, 0))

    cache, state = jax.lax.while_loop(cond, body, (cache, state))

  _, buf, slp, dlp, length, done, _, verifies, accepted = state
  mask = (jnp.arange(t_max)[None, :] < length[:, None]).astype(jnp.int32)
  out = Rollout(prompt_tokens=prompt_b, prompt_mask=prompt_mask_b, tokens=buf[:, :t_max],
                mask=mask, sampler_logp=slp[:, :t_max], draw_logp=dlp[:, :t_max],
                lengths=length, truncated=~done,
                extras={speculative.STAT_VERIFIES: verifies,
                        speculative.STAT_ACCEPTED: accepted})
  return out, dict(verifies=verifies, accepted=accepted)

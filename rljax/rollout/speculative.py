"""Lossless speculative decoding: drafts, exact acceptance and the residual distribution.

Speculative sampling (Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"): a cheap *draft* proposes ``k`` tokens ``d_1..d_k`` with distributions
``q_1..q_k``; the target (the policy, through ``p_i`` = its *processed* sampling distribution:
temperature, top-k, top-p, min-p as configured) scores all of them in one forward of ``k + 1``
tokens. Token ``d_i`` is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first
rejection ``i`` the emitted token is drawn from the residual ``norm(max(p_i - q_i, 0))``, and when
all ``k`` are accepted a bonus token is drawn from ``p_{k+1}``. Every emitted token then follows
``p`` exactly (Leviathan et al., Theorem 3.5 / Appendix A.1), so the rollout's distribution is
plain sampling's; greedy decoding (``p`` a point mass on the argmax) emits the plain sampler's
tokens.

A deterministic draft (prompt lookup, or a greedy draft) has a one-hot ``q``: ``d_i`` is accepted
with probability ``p_i(d_i)`` and the residual is ``p_i`` without ``d_i``, renormalised. Any
proposal is then exact, so a row with nothing to propose proposes a harmless token.

Drafts (``Draft.kind``; ``rollout.draft``):

- ``ngram``: prompt lookup (Saxena 2023, "Prompt Lookup Decoding"): the latest earlier
  occurrence of the row's last ``n`` tokens in its own context (prompt and completion so far);
  the tokens that followed it are proposed (``ngram_proposals``). No model, one-hot ``q``.
- ``layers``: self-speculative (Zhang et al. 2024, "Draft & Verify"; Elhoushi et al. 2024,
  "LayerSkip"): the policy's first ``m`` layers, its final norm and its head, sampled with the
  same processing; its KV cache is the first ``m`` layers of the policy's own cache (same weights,
  same inputs), so it costs no memory. A stochastic ``q``.

The decode loop that uses them is ``rljax.rollout.spec_decode``.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

DRAFT_KINDS = ("none", "ngram", "layers")
# Per-row counts a speculative rollout carries in ``extras`` ([B] int32): its verification
# forwards and the drafted tokens they accepted (``acceptance_metrics``).
STAT_VERIFIES, STAT_ACCEPTED = "draft_verifies", "draft_accepted"


@dataclasses.dataclass(frozen=True)
class Draft:
  """A speculative-decoding setting (static, hashable).

  Attributes:
    kind: 'ngram' (prompt lookup) or 'layers' (the policy's first ``layers`` layers).
    tokens: ``k``, tokens drafted per verification forward (which feeds ``k + 1``).
    ngram: ``n``, the length of the suffix looked up ('ngram').
    layers: ``m``, the draft's layers ('layers'), fewer than the policy's.
  """
  kind: str
  tokens: int = 4
  ngram: int = 3
  layers: int = 1

  def __post_init__(self):
    if self.kind not in DRAFT_KINDS[1:]:
      raise ValueError(f"rollout.draft={self.kind!r}: expected one of {DRAFT_KINDS}")
    if self.tokens < 1:
      raise ValueError(f"rollout.draft_tokens must be >= 1, got {self.tokens}")
    if self.ngram < 1:
      raise ValueError(f"rollout.draft_ngram must be >= 1, got {self.ngram}")
    if self.layers < 1:
      raise ValueError(f"rollout.draft_layers must be >= 1, got {self.layers}")


def make_draft(kind: str, tokens: int = 4, ngram: int = 3, layers: int = 1) -> Draft | None:
  """``Draft`` of a config's ``rollout.draft*`` values; None for ``kind='none'``."""
  if kind == "none":
    return None
  return Draft(kind, tokens=int(tokens), ngram=int(ngram), layers=int(layers))


def verify_positions(draft: Draft | None) -> int:
  """Positions past a row's ``max_new_tokens`` that its decode loop needs (cache slots, RoPE
  rows): a verification feeds ``k + 1`` tokens from the last one emitted; 0 without a draft."""
  return 0 if draft is None else draft.tokens + 1


def ngram_proposals(seq, valid, end, n: int, k: int):
  """Prompt lookup: ``k`` proposed tokens per row. Returns (proposals [B, k] int32, found [B]).

  seq [B, W] int: each row's context at indices ``0..end`` (``valid`` [B, W] bool marks its real
  tokens: left padding and unwritten slots are not); end [B] int: index of the row's last token.
  The query is ``seq[end-n+1 .. end]``; the match is the largest ``e < end`` with
  ``seq[e-n+1 .. e] == query`` (all valid), and the proposal continues from it with period
  ``P = end - e``: ``seq[e + 1 + (i mod P)]`` for ``i = 0..k-1`` (what followed the match, and
  for a repeating context its continuation). No match: ``seq[end]`` repeated (exact all the same:
  a one-hot draft is accepted with probability ``p(x)``).
  """
  b, w = seq.shape
  idx = jnp.arange(w)
  end = end.astype(jnp.int32)
  take = lambda i: jnp.take_along_axis(seq, jnp.clip(i, 0, w - 1), axis=1)
  ok_at = lambda i: jnp.take_along_axis(valid, jnp.clip(i, 0, w - 1), axis=1) & (i >= 0)
  q_idx = end[:, None] - (n - 1) + jnp.arange(n)[None]  # [B, n]
  query, query_ok = take(q_idx), jnp.all(ok_at(q_idx), axis=1)
  match = (idx[None] < end[:, None]) & (idx[None] >= n - 1)
  for o in range(n):  # seq[e - (n-1) + o] == query[o] for every candidate end e
    shift = n - 1 - o
    s = jnp.pad(seq, ((0, 0), (shift, 0)))[:, :w]
    v = jnp.pad(valid, ((0, 0), (shift, 0)))[:, :w]
    match = match & v & (s == query[:, o:o + 1])
  last_match = jnp.max(jnp.where(match, idx[None], -1), axis=1)
  found = query_ok & (last_match >= 0)
  period = jnp.maximum(end - last_match, 1)
  prop_idx = last_match[:, None] + 1 + jnp.arange(k)[None] % period[:, None]
  last = jnp.take_along_axis(seq, end[:, None], axis=1)
  return jnp.where(found[:, None], take(prop_idx), last).astype(jnp.int32), found


def acceptance_probs(p_logp_d, q_logp_d=None):
  """``min(1, p(d) / q(d))`` per drafted token ([B, k]) from log-probs of the drafted tokens
  under the target ``p`` and the draft ``q``; ``q_logp_d=None``: a one-hot draft, ``p(d)``
  (Leviathan et al. 2023, Algorithm 1)."""
  ratio = p_logp_d if q_logp_d is None else p_logp_d - q_logp_d
  return jnp.exp(jnp.minimum(ratio, 0.0))


def accepted_length(accept_probs, uniforms):
  """Drafted tokens accepted per row [B]: the leading run of ``u_i < min(1, p_i/q_i)``.
  accept_probs, uniforms: [B, k]; ``u ~ U[0, 1)``."""
  accepted = (uniforms < accept_probs).astype(jnp.int32)
  return jnp.sum(jnp.cumprod(accepted, axis=-1), axis=-1)


def residual_logits(p_logp, q_logp=None, drafted=None):
  """Logits of the residual ``norm(max(p - q, 0))`` [.., V] that a rejected position draws from
  (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, eq. 1).

  ``p_logp`` [.., V]: the target's log-distribution; ``q_logp`` [.., V] the draft's, or for a
  one-hot draft ``drafted`` [..] its token: ``p`` without it. Where ``p <= q`` everywhere a
  rejection has probability 0; ``p`` is returned there (never drawn from, but finite).
  """
  if q_logp is None:
    hit = jax.lax.broadcasted_iota(jnp.int32, p_logp.shape, p_logp.ndim - 1) == drafted[..., None]
    out = jnp.where(hit, -jnp.inf, p_logp)
  else:
    diff = jnp.exp(p_logp) - jnp.exp(q_logp)
    out = jnp.where(diff > 0, jnp.log(jnp.where(diff > 0, diff, 1.0)), -jnp.inf)
  empty = jnp.all(out == -jnp.inf, axis=-1, keepdims=True)
  return jnp.where(empty, p_logp, out)


def emitted_block(drafted, n_accepted, last):
  """The tokens a verification emits per row [B, k+1]: ``d_1..d_n`` then the residual or bonus
  token ``last`` at index ``n``; entries after it are ``last`` too (never recorded: the count is
  ``n + 1``)."""
  k = drafted.shape[1]
  j = jnp.arange(k + 1)[None]
  padded = jnp.pad(drafted, ((0, 0), (0, 1)))
  return jnp.where(j < n_accepted[:, None], padded, last[:, None]).astype(jnp.int32)


def emitted_count(block, n_accepted, room, stop_ids: tuple):
  """(tokens recorded per row [B], whether the row stopped [B]): ``n + 1``, cut at ``room`` (the
  row's budget left) and after the first stop token among them."""
  count = jnp.minimum(n_accepted + 1, room)
  if not stop_ids:
    return count, jnp.zeros(count.shape, bool)
  j = jnp.arange(block.shape[1])[None]
  is_stop = jnp.any(block[..., None] == jnp.asarray(stop_ids, jnp.int32), axis=-1)
  is_stop = is_stop & (j < count[:, None])
  first = jnp.min(jnp.where(is_stop, j, block.shape[1]), axis=1)
  stopped = first < block.shape[1]
  return jnp.where(stopped, first + 1, count), stopped


def acceptance_metrics(verifies, accepted, lengths, k: int) -> dict:
  """Speculative decoding's figures over a batch (host arrays [B]): ``draft_accept_rate``, the
  drafted tokens accepted / drafted (``k`` per verification), and ``tokens_per_verify``, the
  tokens emitted per verification forward (accepted + 1, cut at the budget and the stop token;
  a row's token 0 comes from the prefill, not from a verification)."""
  verifies, accepted, lengths = (np.asarray(x, np.float64) for x in (verifies, accepted, lengths))
  n = max(float(verifies.sum()), 1.0)
  emitted = np.maximum(lengths - 1, 0).sum()
  return {"draft_accept_rate": float(accepted.sum()) / (n * k),
          "tokens_per_verify": float(emitted) / n}


def without_counts(extras) -> dict:
  """``extras`` less the per-row acceptance counts (``STAT_VERIFIES``, ``STAT_ACCEPTED``)."""
  return {k: v for k, v in extras.items() if k not in (STAT_VERIFIES, STAT_ACCEPTED)}

"""In-flight weight updates: a rollout decoded in chunks, each with the newest weights.

With asynchronous training (``rollout.max_staleness >= 1``) the learner publishes new weights
while the sampler is still decoding. PipelineRL (arXiv 2509.19128) and AReaL (arXiv 2505.24298)
let the unfinished completions continue under the new weights instead of finishing them under
the old ones: long completions then carry fewer stale tokens. ``sample_inflight`` decodes
``rollout.inflight_chunk`` tokens per call and reads the newest published weights before every
call; the rows still decoding continue with their prompt and tokens so far re-prefilled by the
new weights (AReaL's choice: the KV cache of the old weights is recomputed, PipelineRL keeps
it). So every token's ``sampler_logp`` is exactly its log-prob under the weights that drew it,
which is what the token-level rollout correction (``algo.rollout_is='token'``) divides by, and
the record says which weights those were: ``extras['token_version']`` [B, T] int32, the learner
steps behind each token's weights (-1 on padding).

A chunk's tokens are drawn with ``fold_in(key, chunk)``; rows that stopped in an earlier chunk
keep decoding in later calls (the batch keeps its shape, so each chunk compiles once per width)
and what they decode there is dropped.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from rljax.rollout import speculative
from rljax.rollout.record import Rollout
from rljax.rollout.sampling import SamplingParams

# (params, tokens [N, W], mask [N, W], key, sampling, group_size) -> Rollout with NumPy fields
SampleFn = Callable[..., Rollout]
# () -> (version, params): the newest weights the learner has published
Newest = Callable[[], tuple[int, Any]]


def sample_inflight(sample: SampleFn, newest: Newest, tokens, mask, key,
                    sampling: SamplingParams, group_size: int, chunk: int) -> Rollout:
  """``sample``'s rollout of ``sampling.max_new_tokens`` tokens, decoded ``chunk`` at a time
  with ``newest()``'s weights for each chunk; ``extras['token_version']`` tags every token."""
  if chunk < 1:
    raise ValueError(f"rollout.inflight_chunk must be >= 1 here, got {chunk}")
  t_max, pieces = sampling.max_new_tokens, []
  context, context_mask, g = tokens, mask, group_size
  for c, start in enumerate(range(0, t_max, chunk)):
    version, params = newest()
    width = min(chunk, t_max - start)
    out = sample(params, context, context_mask, jax.random.fold_in(key, c),
                 dataclasses.replace(sampling, max_new_tokens=width), g)
    # Speculative decoding's acceptance counts are not joined (each chunk's token 0 comes from
    # its prefill, not a verification): an in-flight rollout logs no acceptance figures.
    joinable = speculative.without_counts(out.extras)
    if joinable:
      raise ValueError(f"in-flight weight updates cannot join the sampler's extras "
                       f"{sorted(joinable)} across chunks (model.router_replay='R3')")
    alive = np.ones(out.num_rows, bool) if c == 0 else pieces[-1][2] & pieces[-1][0].truncated
    pieces.append((out, version, alive))
    if not (alive & out.truncated).any():
      break
    if c == 0:
      context, context_mask, g = out.prompt_tokens, out.prompt_mask, 1
    # Rows that stopped continue on their padding (marked valid, so every row's context stays
    # one run of tokens); what they decode is dropped.
    context = np.concatenate([context, out.tokens], axis=1)
    context_mask = np.concatenate([context_mask, np.ones_like(out.mask)], axis=1)
  return _join(pieces, t_max, sampling.pad_id)


def _join(pieces: list, t_max: int, pad_id: int) -> Rollout:
  """One ``[B, T]`` record from the chunks' ``(rollout, version, rows alive at its start)``."""
  first = pieces[0][0]
  columns = {"tokens": [], "mask": [], "sampler_logp": [], "draw_logp": [], "token_version": []}
  for out, version, alive in pieces:
    keep = alive[:, None] & (out.mask > 0)
    columns["tokens"].append(np.where(keep, out.tokens, pad_id))
    columns["mask"].append(keep.astype(out.mask.dtype))
    columns["sampler_logp"].append(np.where(keep, out.sampler_logp, 0.0))
    columns["draw_logp"].append(np.where(keep, out.draw_logp, 0.0))
    columns["token_version"].append(np.where(keep, version, -1).astype(np.int32))
  joined = {k: np.concatenate(v, axis=1) for k, v in columns.items()}
  pad = t_max - joined["tokens"].shape[1]
  fill = {"tokens": pad_id, "token_version": -1}
  joined = {k: np.pad(v, ((0, 0), (0, pad)), constant_values=fill.get(k, 0))
            for k, v in joined.items()}
  last_out, _, last_alive = pieces[-1]
  truncated = last_alive & last_out.truncated
  version = joined.pop("token_version")
  return first.replace(**joined, lengths=joined["mask"].sum(axis=1).astype(first.lengths.dtype),
                       truncated=truncated, extras={"token_version": version})

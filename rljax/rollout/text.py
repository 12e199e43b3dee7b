"""Host side of the rollout: tokenize, left-pad to a bucketed width, sample, decode text.

Prompt widths are rounded up to a multiple of ``bucket`` so that a new prompt length does not
trigger a new compilation of the sampler: with a fixed number of prompts per call, a run compiles
the sampler at most ``ceil(max_prompt_tokens / bucket)`` times (once per width actually seen).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from rljax.models.config import ModelConfig
from rljax.rollout.sampler import Rollout, SamplingParams, resolve_stop_ids, sample


def left_pad(seqs: Sequence[Sequence[int]], bucket: int, pad_id: int):
  """Left-pad token lists to a common width, a multiple of ``bucket``.

  Returns ``(tokens [N, W] int32, mask [N, W] int32)`` with ``W = bucket * ceil(max_len /
  bucket)``; real tokens are right-aligned (so the last column is each prompt's last token).
  """
  if bucket < 1:
    raise ValueError(f"bucket must be >= 1, got {bucket}")
  if not len(seqs):
    raise ValueError("left_pad needs at least one sequence")
  lengths = [len(s) for s in seqs]
  if min(lengths) == 0:
    raise ValueError(f"prompt {lengths.index(0)} is empty: every prompt needs at least one token")
  width = -(-max(lengths) // bucket) * bucket
  tokens = np.full((len(seqs), width), pad_id, np.int32)
  mask = np.zeros((len(seqs), width), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, width - len(s):] = np.asarray(s, np.int32)
    mask[i, width - len(s):] = 1
  return tokens, mask


def completion_ids(rollout: Rollout, drop_stop: bool = True) -> list[list[int]]:
  """Completion token ids per row (host lists), cut at the mask; the stop token dropped."""
  tokens = np.asarray(jax.device_get(rollout.tokens))
  lengths = np.asarray(jax.device_get(rollout.lengths))
  truncated = np.asarray(jax.device_get(rollout.truncated))
  out = []
  for row, n, trunc in zip(tokens, lengths, truncated):
    n = int(n) - (1 if drop_stop and not trunc and n > 0 else 0)
    out.append(row[:n].tolist())
  return out


def text_prompts(cfg: ModelConfig, tokenizer, prompts: Sequence[str], sp: SamplingParams,
                 bucket: int = 16):
  """Prompt strings as the sampler takes them: ``(tokens [N, W], mask [N, W], sampling)``.

  The tokenizer needs ``encode(str) -> list[int]`` (``encode_prompt`` is used instead when it
  has one, to apply its chat template / BOS), ``eos_id`` and ``pad_id``. ``tokenizer.eos_id`` is
  added to the stop ids (``sp.stop_ids``, or the model's EOS when it is None) and ``sp.pad_id``
  is replaced by ``tokenizer.pad_id``.
  """
  encode = getattr(tokenizer, "encode_prompt", None) or tokenizer.encode
  ids = [encode(p) for p in prompts]
  stop = resolve_stop_ids(sp, cfg)
  stop = stop if tokenizer.eos_id in stop else stop + (tokenizer.eos_id,)
  sp = dataclasses.replace(sp, stop_ids=stop, pad_id=tokenizer.pad_id)
  tokens, mask = left_pad(ids, bucket, tokenizer.pad_id)
  return tokens, mask, sp


def generate_text(cfg: ModelConfig, params, tokenizer, prompts: Sequence[str], key,
                  sp: SamplingParams, group_size: int = 1, bucket: int = 16):
  """Sample ``group_size`` completions per prompt string and decode them (``text_prompts`` says
  what the tokenizer needs and how the stop ids are set; ``decode(list[int]) -> str`` too).
  Returns ``(rollout, texts)`` with ``len(texts) = len(prompts) * group_size`` (groups
  contiguous); texts exclude the stop token.
  """
  tokens, mask, sp = text_prompts(cfg, tokenizer, prompts, sp, bucket)
  rollout = sample(cfg, params, tokens, mask, key, sp, group_size)
  texts = [tokenizer.decode(c) for c in completion_ids(rollout)]
  return rollout, texts

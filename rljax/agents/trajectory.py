"""An episode's calls as one row of the training record: stitched when they extend each other,
separate samples sharing the episode's reward when they do not.

The rule. An episode's first call's prompt is the row's prompt (``Rollout.prompt_tokens``) and
its answer the row's first policy tokens. Each later call is compared, id for id, with the
previous call's prompt + answer (the exact ids the engine saw and drew):

- it *extends* them (the previous sequence is a prefix of its prompt): its new prompt ids are
  appended as environment tokens (``source`` 2, attended to, never trained on) and its answer as
  policy tokens, in the same *segment* (one sequence, as NeMo-Gym's and verl's agent loops
  stitch a conversation that only grows);
- it does not (the harness dropped a message, rewrote its history, or its chat template
  re-renders earlier turns differently from what the policy wrote, e.g. Qwen3 dropping earlier
  reasoning, or text re-tokenised differently): the call starts a new segment of the row, its
  whole prompt as environment tokens, then its answer. Segments are separate samples: the
  trainer's forward numbers their positions from 0 and keeps attention within each
  (``extras['segment']``, ``rljax.learner.step.sequence_inputs``), exactly as the engine served
  each call, and all of them share the row's reward and advantage (the episode's).

Nothing is ever re-tokenised: every id in the row is one a call's prompt held or the engine drew,
and ``mask`` is 1 exactly on the drawn ones (each call's answer), ``sampler_logp`` /
``draw_logp`` the sampler's for them. The row's budget is ``env.max_tokens`` after the first
prompt: a call whose new prompt ids and one answer token do not fit is refused (a 400,
``episode_budget_exceeded``), and the episode ends truncated (``max_tokens``) with the harness's
reward, as does a call past ``env.max_turns`` (``max_turns``); a first prompt longer than the model's context allows (``data.max_prompt_tokens``) is
refused (``context_length_exceeded``) and fails the episode.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from rljax.agents.serving import CallRecord
from rljax.envs.episodes import SOURCE_ENV, SOURCE_POLICY, Episode, build_record
from rljax.rollout.text import left_pad


def extends(prompt: Sequence[int], previous: CallRecord) -> bool:
  """Whether ``prompt`` starts with the previous call's prompt + answer."""
  before = previous.prompt_ids + previous.completion_ids
  return len(prompt) >= len(before) and list(prompt[:len(before)]) == before


def used(calls: Sequence[CallRecord]) -> int:
  """Positions of the row after its prompt that ``calls`` fill."""
  n = 0
  for k, call in enumerate(calls):
    if k:
      prev = calls[k - 1]
      n += (len(call.prompt_ids) - len(prev.prompt_ids) - len(prev.completion_ids)
            if extends(call.prompt_ids, prev) else len(call.prompt_ids))
    n += len(call.completion_ids)
  return n


def room(calls: Sequence[CallRecord], prompt: Sequence[int], budget: int,
         max_prompt_tokens: int, max_calls: int) -> tuple[int, str, str]:
  """``(answer tokens a call with ``prompt`` may draw, why not, error code)`` under the rule
  (module docstring); ``max_prompt_tokens`` 0: no limit on the first prompt; ``max_calls``:
  calls an episode may make (``env.max_turns``)."""
  if len(calls) >= max_calls:
    return 0, f"the episode made its {max_calls} calls (env.max_turns)", "max_turns"
  if not calls:
    if max_prompt_tokens and len(prompt) > max_prompt_tokens:
      return 0, (f"the first prompt has {len(prompt)} tokens, over the {max_prompt_tokens} the "
                 "model's context leaves before the episode's budget"), "context_length_exceeded"
    return budget, "", ""
  prev = calls[-1]
  new = (len(prompt) - len(prev.prompt_ids) - len(prev.completion_ids)
         if extends(prompt, prev) else len(prompt))
  left = budget - used(calls) - new
  if left < 1:
    return 0, (f"the episode's budget of {budget} tokens after its first prompt "
               f"(env.max_tokens) has no room for this call ({new} new prompt tokens)"), \
        "episode_budget_exceeded"
  return left, "", ""


def stitch(episode: Episode, calls: Sequence[CallRecord]) -> List[int]:
  """Append the calls after the first prompt to ``episode`` (module docstring); returns each
  position's segment (1, 2, ...)."""
  segments, seg = [], 1
  for k, call in enumerate(calls):
    if k:
      prev = calls[k - 1]
      if extends(call.prompt_ids, prev):
        new = call.prompt_ids[len(prev.prompt_ids) + len(prev.completion_ids):]
      else:
        seg += 1
        new = call.prompt_ids
      episode.append(new, SOURCE_ENV)
      segments += [seg] * len(new)
      episode.turn_start = len(episode.ids)
    episode.append(call.completion_ids, SOURCE_POLICY, call.sampler_logp, call.draw_logp)
    segments += [seg] * len(call.completion_ids)
  return segments


def record(episodes: Sequence[Episode], prompts: Sequence[Sequence[int]],
           segments: Sequence[Sequence[int]], versions: Sequence[int], *, budget: int,
           prompt_bucket: int, pad_id: int):
  """The ``Rollout`` of finished episodes: ``build_record``'s, with ``extras['segment']`` [B, T]
  (0 padding) and ``extras['weight_version']`` [B] (the oldest weights any call of the row was
  drawn with)."""
  prompt_tokens, prompt_mask = left_pad(list(prompts), prompt_bucket, pad_id)
  out = build_record(episodes, prompt_tokens, prompt_mask, budget, pad_id)
  seg = np.zeros((len(episodes), budget), np.int32)
  for i, s in enumerate(segments):
    seg[i, :len(s)] = s
  return out.replace(extras={**out.extras, "segment": seg,
                             "weight_version": np.asarray(versions, np.int32)})

"""What an environment returns, checked at the boundary: the one place both multi-turn engines
(the turn-synchronous driver and the continuous one) read ``reset`` / ``step`` results through.

Two halves, both here:

- *in the worker process* (``check_reset``, ``check_step``, run by ``rljax.envs.runner``): the
  types. An observation is text, token ids (ints, not bools) or chat messages
  (``{"role": str, "content": str}``, rendered with the tokenizer's chat template); a reward is a
  real number finite in float32 (``1e300`` would become ``inf`` in the record); ``done`` is a
  bool (``'no'`` is not False); ``info`` is a dict whose declared fields (``INFO_FIELDS``) have
  their types (``correct`` a bool: ``'no'`` must not count as correct; ``tool_calls`` /
  ``tool_errors`` counts in ``[0, MAX_COUNT]``), the rest plain data.
- *in the driver* (``first_observation_ids``, ``observation_ids``, called by the engines' shared
  bookkeeping in ``rljax.envs.episodes``): the tokens. Text longer than the room it may fill times
  ``MAX_CHARS_PER_TOKEN`` is never encoded whole (a 10 MB observation costs a slice, not the
  trainer's memory); ids lie in ``[0, vocab)``; the first observation is not empty (it would be a
  lone BOS) and leaves ``env.max_tokens`` positions in the model's context.

A result that fails a check raises ``EnvResultError`` (its message says which value and why); the
engines end that trajectory with reward 0, counted in ``env/errors`` and explained in the run's
``env_failures.jsonl`` (``rljax.envs.failures``).
"""
from __future__ import annotations

import math
import numbers
from typing import Any, List, Optional

import numpy as np

from rljax.envs import tools as tools_lib
from rljax.envs.base import StepResult, plain
from rljax.errors import RljaxError

# Text longer than (tokens it may fill) x this is cut before encoding: no vocabulary in use has
# tokens this long, so the cut never changes the tokens kept, only how much is encoded.
MAX_CHARS_PER_TOKEN = 64
MAX_COUNT = 10**6  # most tool calls (or tool errors) one turn may report
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Fields of ``info`` the engines read, and their types.
INFO_FIELDS = {"correct": "bool", "tool_calls": "count", "tool_errors": "count"}


class EnvResultError(RljaxError, ValueError):
  """An environment returned something that breaks the protocol (``rljax.envs.base``)."""


def _describe(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


# --- in the worker -------------------------------------------------------------------------------


def check_observation(value, what: str = "observation"):
  """``value`` as text, a list of token ids or a list of chat messages (plain data)."""
  if isinstance(value, str):
    return value
  if isinstance(value, np.ndarray):
    if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
      raise EnvResultError(f"{what} is an array of {value.dtype} with shape {value.shape}, not "
                           "1-d token ids")
    return [int(v) for v in value]
  if isinstance(value, (list, tuple)):
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
           for v in value):
      return [int(v) for v in value]
    if all(isinstance(v, dict) for v in value):
      for m in value:
        if not (isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
          raise EnvResultError(f"{what}: a chat message needs a str 'role' and a str "
                               f"'content', got {_describe(m)}")
      return [{"role": m["role"], "content": m["content"]} for m in value]
    bad = next(v for v in value if not isinstance(v, (int, np.integer, dict))
               or isinstance(v, (bool, np.bool_)))
    raise EnvResultError(f"{what} is a list holding {_describe(bad)}: expected token ids (ints) "
                         "or chat messages (dicts), one kind")
  raise EnvResultError(f"{what} must be text, token ids or chat messages, got "
                       f"{type(value).__name__} {_describe(value)}")


def check_reward(value) -> float:
  """A real number (bools and numpy scalars included) finite in float32."""
  if not isinstance(value, numbers.Real):
    raise EnvResultError(f"reward must be a number, got {type(value).__name__} "
                         f"{_describe(value)}")
  reward = float(value)
  if not math.isfinite(reward) or abs(reward) > FLOAT32_MAX:
    raise EnvResultError(f"reward {_describe(value)} is not finite in float32 (|r| <= "
                         f"{FLOAT32_MAX:.3g})")
  return reward


def check_done(value) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise EnvResultError(f"done must be a bool, got {type(value).__name__} {_describe(value)}")
  return bool(value)


def check_info(info) -> dict:
  """``info`` as plain data, its declared fields (``INFO_FIELDS``) of their types."""
  if info is None:
    return {}
  if not isinstance(info, dict):
    raise EnvResultError(f"info must be a dict, got {type(info).__name__} {_describe(info)}")
  out = plain(info)
  for name, kind in INFO_FIELDS.items():
    if name not in info:
      continue
    value = info[name]
    if kind == "bool":
      if not isinstance(value, (bool, np.bool_)):
        raise EnvResultError(f"info[{name!r}] must be a bool, got {type(value).__name__} "
                             f"{_describe(value)}")
      out[name] = bool(value)
    else:
      if (not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_))
          or not 0 <= value <= MAX_COUNT):
        raise EnvResultError(f"info[{name!r}] must be a count in [0, {MAX_COUNT}], got "
                             f"{_describe(value)}")
      out[name] = int(value)
  return out


def check_reset(value):
  """A first observation (``reset``'s return) as plain data."""
  return check_observation(value, "the first observation")


def check_step(result) -> tuple:
  """``(observation, reward, done, info)`` of ``step``'s return, checked; the observation of a
  finished episode is ignored (never read), so it may be anything, None included."""
  if not isinstance(result, StepResult):
    if not (isinstance(result, (tuple, list)) and len(result) == 4):
      raise EnvResultError(f"step returned {type(result).__name__} {_describe(result)}, not a "
                           "StepResult or (observation, reward, done, info)")
    result = StepResult(*result)
  reward = check_reward(result.reward)
  done = check_done(result.done)
  info = check_info(result.info)
  observation = "" if done else check_observation(result.observation)
  return observation, reward, done, info


# --- in the driver -------------------------------------------------------------------------------


def _encode_capped(tokenizer, text: str, room: Optional[int]) -> List[int]:
  """``encode(text)`` of at most ``room * MAX_CHARS_PER_TOKEN`` characters of it."""
  return tokenizer.encode(text if room is None else text[:max(room, 0) * MAX_CHARS_PER_TOKEN])


def _check_ids(tokenizer, ids: List[int], what: str) -> List[int]:
  bad = next((i for i in ids if not 0 <= i < tokenizer.vocab_size), None)
  if bad is not None:
    raise EnvResultError(f"{what} holds the token id {bad}, outside the vocabulary [0, "
                         f"{tokenizer.vocab_size})")
  return ids


def first_observation_ids(tokenizer, observation, limit: int) -> List[int]:
  """The prompt's ids of a (checked) first observation: text or chat messages through
  ``encode_prompt``, ids as they are. ``limit``: the most tokens a prompt may hold (the model's
  context less ``env.max_tokens``, ``data.max_prompt_tokens``); 0: no limit."""
  what = "the first observation"
  if isinstance(observation, list) and observation and isinstance(observation[0], int):
    ids = _check_ids(tokenizer, observation, what)
  else:
    chars = (len(observation) if isinstance(observation, str)
             else sum(len(m["content"]) for m in observation))
    if chars == 0:
      raise EnvResultError(f"{what} is empty (it would be a lone BOS token)")
    if limit and chars > limit * MAX_CHARS_PER_TOKEN:
      raise EnvResultError(f"{what} has {chars} characters, more than a prompt of {limit} "
                           "tokens can hold (the model's context less env.max_tokens)")
    ids = tokenizer.encode_prompt(observation)
  if not ids:
    raise EnvResultError(f"{what} is empty")
  if limit and len(ids) > limit:
    raise EnvResultError(f"{what} has {len(ids)} tokens, more than the {limit} a prompt may hold "
                         "(the model's context less env.max_tokens, data.max_prompt_tokens)")
  return ids


def observation_ids(tokenizer, observation, room: Optional[int] = None) -> List[int]:
  """The ids appended for a (checked) step observation with ``room`` positions left in the
  trajectory (the caller cuts them there; None: no limit, a demonstration's): text encoded, chat
  messages rendered with the chat template (``Tokenizer.render_followup``; without one,
  ``tools.render_messages``) and encoded, ids as they are. An empty observation appends
  nothing."""
  if isinstance(observation, str):
    return _encode_capped(tokenizer, observation, room)
  if observation and isinstance(observation[0], dict):
    text = (tokenizer.render_followup(observation) if tokenizer.chat_turns
            else tools_lib.render_messages(observation))
    return _encode_capped(tokenizer, text, room)
  return _check_ids(tokenizer, list(observation), "the observation")

"""Prompts longer than the model can take: an explicit policy, applied before anything is built.

A prompt of ``n`` tokens needs ``n + budget`` positions, the budget being what follows the prompt
(``completion_budget``: ``rollout.max_new_tokens``, or ``env.max_tokens`` for a multi-turn run,
whose episodes hold every turn and observation after the prompt). The limit is the smaller of
``data.max_prompt_tokens`` (0 = none) and the model's context, ``max_position_embeddings -
budget``. ``data.overlong_prompts`` says what happens
to a longer prompt:

- ``'error'``: the run stops at start-up with one line naming the prompt (file and line for file
  datasets), its length and the limit;
- ``'drop'``: the prompt is left out; ``PromptSource.dropped_prompts`` counts them (logged at
  start-up, and a metric of the loop).

File datasets are checked in full when the run starts; an embedded task's prompts are checked as
they are drawn. Either way a 1 MB prompt never reaches the sampler (where it would ask XLA for a
[B, 10^6] prefill).
"""
from __future__ import annotations

from typing import Callable

from rljax.data.tasks import Problem
from rljax.errors import RljaxError, TokenizerError
from rljax import models
from rljax.models import ModelConfig
from rljax.config.sources import POLICY_SOURCES, parse_source, run_config

POLICIES = ("error", "drop")


class ContextError(RljaxError, ValueError):
  """``rollout.max_new_tokens`` does not fit the model's context."""


class PromptTooLongError(RljaxError, ValueError):
  """A prompt longer than the limit under ``data.overlong_prompts='error'``."""


def completion_budget(config) -> tuple[int, str]:
  """``(positions after the prompt, the key that sets them)``: ``env.max_tokens`` when
  ``env.name`` names an environment (a multi-turn episode: every turn and observation), else
  ``rollout.max_new_tokens``."""
  env = config.get("env")
  if env is not None and env.get("name"):
    return int(env.max_tokens), "env.max_tokens"
  return int(config.rollout.max_new_tokens), "rollout.max_new_tokens"


def prompt_token_limit(max_prompt_tokens: int, context: int, budget: int,
                       budget_key: str = "rollout.max_new_tokens") -> int:
  """The longest prompt in tokens: ``min(max_prompt_tokens or inf, context - budget)``."""
  room = context - budget
  if room < 1:
    raise ContextError(f"{budget_key}={budget} leaves no room for a prompt in the model's context "
                       f"of {context} positions (max_position_embeddings)")
  return min(max_prompt_tokens, room) if max_prompt_tokens > 0 else room


def model_context(config, tokenizer) -> int:
  """``max_position_embeddings`` of the policy ``model.source`` names, without loading weights
  (and without training the SFT cold start: its architecture is the tiny one; a run's is its own
  config's source's)."""
  source = parse_source(config.model.source, "model.source", POLICY_SOURCES)
  if source.kind == "run":
    return model_context(run_config(source.path), tokenizer)
  if source.kind == "hf":
    return ModelConfig.from_hf_dir(source.path).max_position_embeddings
  return models.tiny_config(config.model, tokenizer.vocab_size, eos_token_id=tokenizer.eos_id,
                            pad_token_id=tokenizer.pad_id).max_position_embeddings


def where(problem: Problem) -> str:
  """'data/x.jsonl:12', 'hf:dir row 3' or the prompt's first characters."""
  meta = problem.meta
  if "line" in meta:
    return f"{meta['source']}:{meta['line']}"
  if "row" in meta:
    return f"{meta['source']} row {meta['row']}"
  return f"prompt {problem.prompt[:60]!r}"


def length_check(count_tokens: Callable[[str], int], limit: int, policy: str,
                 budget_key: str = "rollout.max_new_tokens") -> Callable[[Problem], bool]:
  """``keep(problem)``: True if it fits; False (drop) or ``PromptTooLongError`` (error) if not."""
  if policy not in POLICIES:
    raise RljaxError(f"data.overlong_prompts={policy!r}; allowed: {list(POLICIES)}")

  def keep(problem: Problem) -> bool:
    try:
      n = count_tokens(problem.prompt)
    except TokenizerError as e:  # a character the tokenizer cannot encode: name the row
      raise TokenizerError(
          f"{where(problem)}: {e}; set data.tokenizer to one that covers it") from None
    if n <= limit:
      return True
    if policy == "error":
      raise PromptTooLongError(
          f"{where(problem)}: prompt of {n} tokens exceeds the limit of {limit} (the smaller of "
          f"data.max_prompt_tokens and the model's context minus {budget_key}); set "
          "data.overlong_prompts='drop' to leave such prompts out")
    return False
  return keep


def apply_prompt_policy(source, config, tokenizer, *, log=print) -> int:
  """Apply ``data.max_prompt_tokens`` / ``data.overlong_prompts`` to a ``PromptSource``; returns
  the number of prompts dropped so far (file datasets: all of them, at once)."""
  budget, budget_key = completion_budget(config)
  limit = prompt_token_limit(config.data.max_prompt_tokens, model_context(config, tokenizer),
                             budget, budget_key)
  keep = length_check(lambda text: len(tokenizer.encode_prompt(text)), limit,
                      config.data.overlong_prompts, budget_key)
  source.set_prompt_filter(keep)
  if source.dropped_prompts:
    log(f"data.overlong_prompts='drop': left out {source.dropped_prompts} prompts longer than "
        f"{limit} tokens")
  return source.dropped_prompts

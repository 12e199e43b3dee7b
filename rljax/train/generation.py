"""Problems -> scored rollouts: sample completions with the policy, verify them, shape rewards.

Used by the RL loop (``rljax.train.loop.collect_batch``) and by evaluation alike.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from rljax import rollout as rollout_lib
from rljax.data import prompt_policy
from rljax.envs.failures import FailureReport
from rljax.parallel import distributed, rules
from rljax.rewards import shaping
from rljax.rollout import inflight
from rljax.rollout.sampler import Rollout
from rljax.envs.rollout import EnvSettings
from rljax.envs.rollout import run_episodes
from rljax.envs.continuous import run_episodes_continuous


@dataclasses.dataclass(frozen=True)
class Generator:
  """What turns problems into scored rollouts: the policy's sampler, the tokenizer, the
  verifier, and the reward shaping (``rljax.train.loop.generate``)."""
  model: Any  # rljax.train.build.LoadedModel: sample(params, tokens, mask, key, sampling, G)
  tokenizer: Any
  verifier: Callable  # (completions, problems) -> rljax.rewards.Scores
  prompt_bucket: int
  overlong_buffer: int
  overlong_penalty: float
  # rljax.envs.rollout.EnvSettings: multi-turn rollouts in that environment (``env.name``); None:
  # single-turn completions scored by ``verifier``.
  env: Any = None
  # ``rollout.inflight_chunk``: tokens per chunk of a rollout that takes newer weights between
  # chunks when the caller passes ``newest`` (the asynchronous sampler); 0 = off.
  inflight_chunk: int = 0
  # rljax.envs.failures.FailureReport: told of every multi-turn batch (its failed episodes
  # logged, sampled into the run dir, the run stopped if the first batch all failed).
  env_failures: Any = None

  @property
  def mesh(self):
    return self.model.mesh



def with_env(gen: Generator, config, failure_log: str | None = None) -> Generator:
  """``gen`` set up for the config's rollout mode: multi-turn in ``env.name``'s environment
  (its first observations limited to the model's context less ``env.max_tokens``; failed
  episodes reported, a sample written to ``failure_log``), or single-turn (unchanged) when it is
  None."""
  settings = EnvSettings.from_config(config)
  if settings is None:
    return gen
  budget, key = prompt_policy.completion_budget(config)
  limit = prompt_policy.prompt_token_limit(
      config.data.max_prompt_tokens, prompt_policy.model_context(config, gen.tokenizer), budget,
      key)
  return dataclasses.replace(
      gen, env=dataclasses.replace(settings, max_prompt_tokens=limit),
      env_failures=FailureReport(settings.name, failure_log, config.reward.max_logged_failures))


def continuations(gen: Generator, params) -> Callable:
  """``fn(tokens [N, W], mask [N, W], key, sampling, group_size) -> Rollout`` (NumPy): the
  policy's sampler on left-padded token ids, rows sharded over the mesh's data axes. The one
  call through which both rollout modes sample."""
  def fn(tokens, mask, key, sampling, group_size):
    # Every process holds the same prompts; each feeds its own rows of the global batch, and
    # every process gets all completions back (the verifiers see the whole batch).
    rows = rules.batch_sharding(gen.mesh, 2)
    tokens, mask, key = distributed.from_host((tokens, mask, np.asarray(key)),
                                              (rows, rows, rules.replicated(gen.mesh)))
    out = distributed.to_host(gen.model.sample(params, tokens, mask, key, sampling, group_size))
    return jax.tree.map(np.asarray, out)
  return fn


def episodes(gen: Generator, params, problems, key, sampling: rollout_lib.SamplingParams,
             group_size: int):
  """Multi-turn episodes in ``gen.env`` with the engine it names (``env.engine``): the
  turn-synchronous driver around the policy's sharded sampler, or continuous batching across
  turns (its cache store and lanes on the default device; the params are read where they are)."""
  if gen.env.engine == "continuous":
    return run_episodes_continuous(problems, key, cfg=gen.model.cfg, params=params,
                                   tokenizer=gen.tokenizer, settings=gen.env, sampling=sampling,
                                   group_size=group_size, prompt_bucket=gen.prompt_bucket,
                                   slots=gen.env.slots, dtype=gen.model.dtype)
  return run_episodes(problems, key, generate=continuations(gen, params), tokenizer=gen.tokenizer,
                      settings=gen.env, sampling=sampling, group_size=group_size,
                      prompt_bucket=gen.prompt_bucket, row_multiple=rules.batch_divisor(gen.mesh))


def generate(gen: Generator, params, problems, key, sampling: rollout_lib.SamplingParams,
             group_size: int, newest=None) -> tuple[Rollout, list[str], dict]:
  """Sample ``group_size`` completions per problem and score them on the host: the sampler's
  ``Rollout`` (NumPy) with ``rewards`` (shaped), ``correct`` and ``row_valid`` added, the
  decoded completions, and the verifier's counts (``reward/timeouts``, ``/errors``,
  ``/invalid``). With ``gen.env`` set: multi-turn episodes in that environment
  (``rljax.envs.rollout``), the transcripts after the prompts, and the ``env/*`` counts.
  ``newest``: ``() -> (version, params)``; with ``gen.inflight_chunk`` the completions are
  decoded in chunks, each with the newest weights (``rljax.rollout.inflight``)."""
  if gen.env is not None:
    result = episodes(gen, params, problems, key, sampling, group_size)
    if gen.env_failures is not None:
      gen.env_failures(result)
    return result.rollout, result.transcripts, result.counts
  prompt_ids = [gen.tokenizer.encode_prompt(p.prompt) for p in problems]
  tokens, mask = rollout_lib.left_pad(prompt_ids, gen.prompt_bucket, gen.tokenizer.pad_id)
  if newest is not None and gen.inflight_chunk:
    sample = lambda weights, *args: continuations(gen, weights)(*args)
    out = inflight.sample_inflight(sample, newest, tokens, mask, key, sampling, group_size,
                                   gen.inflight_chunk)
  else:
    out = continuations(gen, params)(tokens, mask, key, sampling, group_size)
  completions = [gen.tokenizer.decode(row[:n]) for row, n in zip(out.tokens, out.lengths)]
  scores = gen.verifier(completions, [p for p in problems for _ in range(group_size)])
  rewards, correct = scores
  rewards = np.asarray(rewards, np.float32) + np.asarray(
      shaping.overlong_penalty(out.lengths, max_new_tokens=sampling.max_new_tokens,
                               overlong_buffer=gen.overlong_buffer,
                               overlong_penalty=gen.overlong_penalty), np.float32)
  scored = out.replace(rewards=rewards, correct=np.asarray(correct, bool),
                       row_valid=np.ones(len(completions), np.float32))
  return scored, completions, scores.metrics()

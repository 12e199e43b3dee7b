"""Problems -> scored rollouts: sample completions with the policy, verify them, shape rewards.

Used by the RL loop (``rljax.train.loop.collect_batch``) and by evaluation alike.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from rljax import rollout as rollout_lib
from rljax.rewards import shaping
from rljax.rollout import inflight
from rljax.rollout.engines import EpisodeEngine, RolloutEngine
from rljax.rollout.sampler import Rollout


@dataclasses.dataclass(frozen=True)
class Generator:
  """What turns problems into scored rollouts: the rollout engine, the tokenizer, the verifier,
  and the reward shaping (``rljax.train.loop.generate``)."""
  # ``rollout.engine``'s engine; with ``env.name`` set, ``env.engine``'s multi-turn driver around
  # it (an ``EpisodeEngine``: whole episodes in that environment, scored by it).
  engine: RolloutEngine
  tokenizer: Any
  verifier: Callable  # (completions, problems) -> rljax.rewards.Scores
  prompt_bucket: int
  overlong_buffer: int
  overlong_penalty: float
  # ``rollout.inflight_chunk``: tokens per chunk of a rollout that takes newer weights between
  # chunks when the caller passes ``newest`` (the asynchronous sampler); 0 = off.
  inflight_chunk: int = 0
  # rljax.envs.failures.FailureReport: told of every multi-turn batch (its failed episodes
  # logged, sampled into the run dir, the run stopped if the first batch all failed).
  env_failures: Any = None

  @property
  def multi_turn(self) -> bool:
    return isinstance(self.engine, EpisodeEngine)

  @property
  def model_cfg(self):
    return self.engine.model_cfg


def generate(gen: Generator, params, problems, key, sampling: rollout_lib.SamplingParams,
             group_size: int, newest=None) -> tuple[Rollout, list[str], dict]:
  """Sample ``group_size`` completions per problem with ``gen.engine`` and score them on the
  host: the engine's ``Rollout`` (NumPy) with ``rewards`` (shaped), ``correct`` and
  ``row_valid`` added, the decoded completions, and the verifier's counts (``reward/timeouts``,
  ``/errors``, ``/invalid``). A multi-turn engine runs episodes in its environment
  (``rljax.envs.engines``): the transcripts after the prompts, and the ``env/*`` counts.
  ``params``: weights the engine reads (``engine.transfer``'s), loaded first; None: the ones it
  holds. ``newest``: ``() -> (version, weights)``; with ``gen.inflight_chunk`` the completions are
  decoded in chunks, each after loading the newest weights (``rljax.rollout.inflight``)."""
  engine = gen.engine
  if params is not None:
    engine.load_weights(params, engine.version)
  if gen.multi_turn:
    result = engine.episodes(problems, key, sampling, group_size)
    if gen.env_failures is not None:
      gen.env_failures(result)
    return result.rollout, result.transcripts, result.counts
  prompt_ids = [gen.tokenizer.encode_prompt(p.prompt) for p in problems]
  tokens, mask = rollout_lib.left_pad(prompt_ids, gen.prompt_bucket, gen.tokenizer.pad_id)
  if newest is not None and gen.inflight_chunk:
    def newest_loaded():  # every chunk samples with the newest weights, loaded into the engine
      version, weights = newest()
      engine.load_weights(weights, version)
      return version, weights
    sample = lambda _weights, *args: engine.generate(*args)
    out = inflight.sample_inflight(sample, newest_loaded, tokens, mask, key, sampling,
                                   group_size, gen.inflight_chunk)
  else:
    out = engine.generate(tokens, mask, key, sampling, group_size)
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

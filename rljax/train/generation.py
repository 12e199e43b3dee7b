"""Problems -> scored rollouts: sample completions with the policy, score them with the run's
reward sources (``rljax.rewards.sources``), shape rewards.

Used by the RL loop (``rljax.train.loop.collect_batch``) and by evaluation alike.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from rljax import rollout as rollout_lib
from rljax.data import images as images_lib
from rljax.rewards import shaping, sources
from rljax.rollout import inflight
from rljax.rollout.engines import EpisodeEngine, RolloutEngine
from rljax.rollout.sampler import Rollout
from rljax.vision import multimodal


@dataclasses.dataclass(frozen=True)
class Generator:
  """What turns problems into scored rollouts: the rollout engine, the tokenizer, the composed
  reward (``reward.sources``) and the reward shaping (``rljax.train.loop.generate``)."""
  # ``rollout.engine``'s engine; with ``env.name`` set, ``env.engine``'s multi-turn driver around
  # it (an ``EpisodeEngine``: whole episodes in that environment, scored by it).
  engine: RolloutEngine
  tokenizer: Any
  reward: Callable  # RewardBatch -> rljax.rewards.sources.Composed (a sources.Reward)
  prompt_bucket: int
  overlong_buffer: int
  overlong_penalty: float
  # ``rollout.inflight_chunk``: tokens per chunk of a rollout that takes newer weights between
  # chunks when the caller passes ``newest`` (the asynchronous sampler); 0 = off.
  inflight_chunk: int = 0
  # rljax.envs.failures.FailureReport: told of every multi-turn batch (its failed episodes
  # logged, sampled into the run dir, the run stopped if the first batch all failed).
  env_failures: Any = None
  # rljax.rewards.checkers.FailureLog: where the sources' failed calls are sampled (None: not
  # written; each batch's failures are still logged in one line).
  failure_log: Any = None
  # A vision-language policy's image processor (``rljax.data.images.vision_processor``): prompts
  # are encoded with their images' placeholders and the engine takes each row's images; None:
  # text prompts.
  image_processor: Any = None

  @property
  def multi_turn(self) -> bool:
    return isinstance(self.engine, EpisodeEngine)

  @property
  def model_cfg(self):
    return self.engine.model_cfg


def generate(gen: Generator, params, problems, key, sampling: rollout_lib.SamplingParams,
             group_size: int, newest=None) -> tuple[Rollout, list[str], dict]:
  """Sample ``group_size`` completions per problem with ``gen.engine`` and score them on the
  host: the engine's ``Rollout`` (NumPy) with ``rewards`` (composed, then shaped), ``correct``
  (the task source's) and ``row_valid`` added and each source's raw scores in its host
  ``extras['reward/<name>']``, the decoded completions, and the sources' counts
  (``reward/timeouts``, ``/errors``, ``/invalid`` of the verifier). A multi-turn engine runs
  episodes in its environment (``rljax.envs.drivers``; its reward is the source ``env``): the
  transcripts after the prompts, and the ``env/*`` counts.
  ``params``: weights the engine reads (``engine.transfer``'s), loaded first; None: the ones it
  holds. ``newest``: ``() -> (version, weights)``; with ``gen.inflight_chunk`` the completions are
  decoded in chunks, each after loading the newest weights (``rljax.rollout.inflight``)."""
  engine = gen.engine
  if params is not None:
    engine.load_weights(params, engine.version)
  rows = [p for p in problems for _ in range(group_size)]
  if gen.multi_turn:
    result = engine.episodes(problems, key, sampling, group_size)
    if gen.env_failures is not None:
      gen.env_failures(result)
    out = result.rollout
    composed = _score(gen, out, rows, result.transcripts, out.rewards, out.correct)
    scored = out.replace(rewards=composed.rewards, correct=composed.correct,
                         extras={**out.extras, **composed.extras()})
    return scored, result.transcripts, {**result.counts, **composed.metrics}
  tokens, mask, images = prompt_rows(gen, problems)
  if images is not None:
    if newest is not None and gen.inflight_chunk:
      raise ValueError("prompts with images are sampled whole: rollout.inflight_chunk=0")
    out = engine.generate(tokens, mask, key, sampling, group_size, images=images)
  elif newest is not None and gen.inflight_chunk:
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
  composed = _score(gen, out, rows, completions)
  # Shaping applies after composition (docs/algorithms.md section 1).
  rewards = composed.rewards + np.asarray(
      shaping.overlong_penalty(out.lengths, max_new_tokens=sampling.max_new_tokens,
                               overlong_buffer=gen.overlong_buffer,
                               overlong_penalty=gen.overlong_penalty), np.float32)
  scored = out.replace(rewards=rewards, correct=composed.correct,
                       row_valid=np.ones(len(completions), np.float32),
                       extras={**out.extras, **composed.extras()})
  return scored, completions, dict(composed.metrics)


def prompt_rows(gen: Generator, problems):
  """``(tokens [P, W], mask [P, W], images)``: the problems' prompts left-padded to a multiple of
  ``gen.prompt_bucket``; with an image processor, each ``<image>`` marker expanded into the
  family's placeholders (``images_lib.encode_image_prompts``) and ``images`` each row's own
  (``multimodal.RowImages``), else None."""
  if gen.image_processor is None:
    ids = [gen.tokenizer.encode_prompt(p.prompt) for p in problems]
    return (*rollout_lib.left_pad(ids, gen.prompt_bucket, gen.tokenizer.pad_id), None)
  encoded = images_lib.encode_image_prompts(gen.tokenizer, problems, gen.image_processor)
  tokens, mask = rollout_lib.left_pad(encoded.ids, gen.prompt_bucket, gen.tokenizer.pad_id)
  return tokens, mask, multimodal.row_images(gen.model_cfg, tokens, mask, encoded.pixel_values,
                                             encoded.image_grid_thw)


def _score(gen: Generator, out: Rollout, rows, completions, episode_rewards=None,
           episode_correct=None) -> sources.Composed:
  """The composed reward of a sampled batch (``rows``: its problem per row); failed calls
  sampled into ``gen.failure_log``."""
  batch = sources.RewardBatch(
      prompts=[p.prompt for p in rows], completions=completions, problems=rows,
      prompt_tokens=out.prompt_tokens, prompt_mask=out.prompt_mask, tokens=out.tokens,
      mask=out.mask, episode_rewards=episode_rewards, episode_correct=episode_correct)
  composed = gen.reward(batch)
  if gen.failure_log is not None and composed.failures:
    gen.failure_log.append(list(composed.failures))
  return composed

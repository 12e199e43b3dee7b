"""Problems -> scored rollouts: sample completions with the policy, score them with the run's
reward sources (``rljax.rewards.sources``), shape rewards.

Used by the RL loop (``rljax.train.loop.collect_batch``) and by evaluation alike; the rollout
engine and the ``Generator`` of a run are made here from its config (``make_engine``,
``make_generator``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import numpy as np

from rljax import rollout as rollout_lib
from rljax.config.reward_spec import ENV_SOURCE, VERIFIER_SOURCE
from rljax.data import images as images_lib, prompt_policy
from rljax.envs.episodes import EnvSettings
from rljax.envs.failures import FailureReport
from rljax.errors import StartupError
from rljax.learner.initial import param_sharding
from rljax.loading import loader
from rljax.models import ModelConfig
from rljax.parallel import distributed, rules
from rljax.registries import EPISODE_ENGINES, ROLLOUT_ENGINES
from rljax.rewards import checkers, shaping, sources
from rljax.rollout import inflight
from rljax.rollout.engines import EpisodeEngine, Placement, RolloutEngine
from rljax.rollout.sampler import Rollout
from rljax.train.startup import _startup, takes_images
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
  # A vision-language policy's ``rljax.data.images.ImageFormat`` (``image_format``): prompts
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


# --- a run's engine and generator, from its config ----------------------------------------------

def engine_placement(model_cfg: ModelConfig, mesh, learner_mesh=None) -> Placement:
  """Where the rollout engine runs: ``mesh`` (the sampler's), rows split over its data axes and
  weights sharded by the partition rules; colocated when it is ``learner_mesh`` (or that is
  None)."""
  return Placement(
      mesh=mesh, colocated=learner_mesh is None or mesh is learner_mesh,
      row_multiple=rules.batch_divisor(mesh), data_axes=tuple(rules.batch_axes()),
      rows=rules.batch_sharding(mesh, 2), replicated=rules.replicated(mesh),
      # The sampler reads merged weights (the base layout), never the adapters themselves.
      param_sharding=param_sharding(mesh, model_cfg.base), to_device=distributed.from_host,
      to_host=distributed.to_host, context=rules.context_layout(mesh))


def make_engine(config, model_cfg: ModelConfig, mesh, tokenizer, learner_mesh=None,
                settings: EnvSettings | None = None) -> RolloutEngine:
  """The run's rollout engine, chosen once: ``rollout.engine``'s on ``mesh``, inside
  ``env.engine``'s multi-turn driver when ``env.name`` is set (``settings``: another
  environment than the config's)."""
  factory = _startup(ROLLOUT_ENGINES.get, config.rollout.engine)
  engine = _startup(factory, config, model_cfg, engine_placement(model_cfg, mesh, learner_mesh))
  _check_weight_dtype(config, engine)
  settings = settings or env_settings(config, tokenizer)
  if settings is None:
    return engine
  driver = _startup(EPISODE_ENGINES.get, settings.engine)
  return _startup(driver, engine, settings, tokenizer, config.data.prompt_bucket)


def _check_weight_dtype(config, engine) -> None:
  """``rollout.weight_dtype`` is applied by a JAX engine's weight sync (``rljax.rollout.engines.
  weight_sync``); an engine built without it would sample at full precision: refused by name."""
  dtype = config.rollout.weight_dtype
  sync = getattr(engine, "sync", None)
  if dtype is not None and getattr(sync, "weight_dtype", None) != dtype:
    raise StartupError(f"rollout.weight_dtype={dtype!r} is not applied by rollout.engine="
                       f"{config.rollout.engine!r} (its weights do not pass through "
                       "rljax.rollout.engines.weight_sync); set it to None or use all_rows / "
                       "continuous")


def env_settings(config, tokenizer) -> EnvSettings | None:
  """``env.name``'s settings (None: single-turn), its first observations limited to the model's
  context less the episode's budget (``env.max_tokens``), as prompts are."""
  settings = EnvSettings.from_config(config)
  if settings is None:
    return None
  budget, key = prompt_policy.completion_budget(config)
  limit = prompt_policy.prompt_token_limit(
      config.data.max_prompt_tokens, prompt_policy.model_context(config, tokenizer), budget, key)
  return dataclasses.replace(settings, max_prompt_tokens=limit)


def sampling_params(config, tokenizer, greedy: bool = False) -> rollout_lib.SamplingParams:
  r = config.rollout
  return rollout_lib.SamplingParams(
      temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, min_p=r.min_p, greedy=greedy,
      max_new_tokens=r.max_new_tokens, stop_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)





def make_generator(config, engine: RolloutEngine, tokenizer, source,
                   failure_log: str | None = None,
                   env_failure_log: str | None = None, mesh=None,
                   task_only: bool = False) -> "Generator":
  """``failure_log`` / ``env_failure_log``: where failed reward calls / failed episodes of a
  multi-turn engine are sampled (None: reported, not written). The reward is composed of
  ``reward.sources`` (``rljax.rewards.sources``; their factories see ``mesh``, the learner's);
  ``task_only``: of the task's own source alone (an evaluation reads only its correct flags)."""
  r = config.reward
  failures, task = None, VERIFIER_SOURCE
  if isinstance(engine, EpisodeEngine):
    failures = FailureReport(config.env.name, env_failure_log, r.max_logged_failures)
    task = ENV_SOURCE
  load = functools.partial(_reward_model, config, tokenizer, engine.model_cfg)
  reward = _startup(functools.partial(sources.make_reward, task_only=task_only, task=task,
                                      load=load), config, tokenizer, engine.model_cfg, mesh)
  log = None if failure_log is None else checkers.FailureLog(failure_log, r.max_logged_failures)
  processor = None
  if takes_images(config, engine.model_cfg):
    processor = images_lib.image_format(
        engine.model_cfg, tokenizer, loader.hf_dir(config, loader.source_of(config, "policy")))
  return Generator(engine=engine, tokenizer=tokenizer, reward=reward,
                   prompt_bucket=config.data.prompt_bucket, overlong_buffer=r.overlong_buffer,
                   overlong_penalty=r.overlong_penalty,
                   inflight_chunk=config.rollout.get("inflight_chunk", 0), env_failures=failures,
                   failure_log=log, image_processor=processor)


def _reward_model(config, tokenizer, policy_cfg: ModelConfig, role: str):
  """A reward source's model (the judge, the reward model) read by ``rljax.loading``."""
  return loader.load(config, role, tokenizer, policy_cfg=policy_cfg)

"""The episode engines (``env.engine``, ``EPISODE_ENGINES``): multi-turn drivers, each wrapping
the run's rollout engine (``rollout.engine``, ``rljax.rollout.engines``: what samples a turn),
passing ``generate`` / weights / ``close`` through to it and adding ``episodes(problems, key,
sampling, group_size)``.

- ``turn_sync``: ``rljax.envs.episodes.run_episodes``, every turn one ``base.generate`` call over
  the live rows;
- ``async_turns``: ``rljax.envs.async_turns.run_async_episodes``, continuous batching across
  turns with its own decode loop, reading the base engine's weights and sampler dtype (so the
  base must be a JAX engine: ``rljax.rollout.engines.JaxEngine``).

The environment's reward is the reward source ``env`` (``rljax.rewards.sources``), registered
here.
"""
from __future__ import annotations

from rljax.config.reward_spec import ENV_SOURCE
from rljax.envs.async_turns import run_async_episodes
from rljax.envs.base import check_engine
from rljax.envs.episodes import EnvSettings, MultiTurnResult, run_episodes
from rljax.errors import RewardSourceError, StartupError
from rljax.rewards.sources import RewardBatch, Scored, register_reward_source
from rljax.rollout.engines import JaxEngine, RolloutEngine, register_episode_engine
from rljax.rollout.sampling import SamplingParams


class EpisodeEngineBase:
  """A multi-turn driver around ``base``: everything but ``episodes`` is the base engine's."""

  steps = True  # it steps environments (``Environment.stepped``)

  def __init__(self, base: RolloutEngine, settings: EnvSettings, tokenizer, prompt_bucket: int):
    check_engine(settings.name, settings.engine, self.steps)
    self.base, self.settings = base, settings
    self.tokenizer, self.prompt_bucket = tokenizer, prompt_bucket

  @property
  def model_cfg(self):
    return self.base.model_cfg

  @property
  def version(self) -> int:
    return self.base.version

  @property
  def row_multiple(self) -> int:
    return self.base.row_multiple

  def transfer(self, params):
    return self.base.transfer(params)

  def load_weights(self, weights, version: int) -> None:
    self.base.load_weights(weights, version)

  def generate(self, tokens, mask, key, sampling: SamplingParams, group_size: int):
    return self.base.generate(tokens, mask, key, sampling, group_size)

  def close(self) -> None:
    self.base.close()


class TurnSyncEngine(EpisodeEngineBase):
  """Every turn is one ``base.generate`` call over the rows still running, then every step."""

  def episodes(self, problems, key, sampling: SamplingParams, group_size: int
               ) -> MultiTurnResult:
    return run_episodes(problems, key, generate=self.base.generate, tokenizer=self.tokenizer,
                        settings=self.settings, sampling=sampling, group_size=group_size,
                        prompt_bucket=self.prompt_bucket, row_multiple=self.base.row_multiple)


class AsyncTurnsEngine(EpisodeEngineBase):
  """Continuous batching across turns: its cache store and lanes on the default device, the base
  engine's weights read where they are."""

  def __init__(self, base: RolloutEngine, settings: EnvSettings, tokenizer, prompt_bucket: int):
    if not isinstance(base, JaxEngine):
      raise StartupError(f"env.engine='async_turns' decodes with a JAX engine's weights; the "
                         f"rollout engine is a {type(base).__name__}: use env.engine='turn_sync'")
    super().__init__(base, settings, tokenizer, prompt_bucket)

  def episodes(self, problems, key, sampling: SamplingParams, group_size: int
               ) -> MultiTurnResult:
    base = self.base
    return run_async_episodes(problems, key, cfg=base.model_cfg, params=base.weights,
                                   tokenizer=self.tokenizer, settings=self.settings,
                                   sampling=sampling, group_size=group_size,
                                   prompt_bucket=self.prompt_bucket, slots=self.settings.slots,
                                   dtype=base.dtype)


register_episode_engine("turn_sync")(TurnSyncEngine)
register_episode_engine("async_turns", reads=("env.slots",))(AsyncTurnsEngine)


@register_reward_source(ENV_SOURCE)
def env_source(config, tokenizer, model_cfg, mesh):
  """The environment's reward of multi-turn episodes (``env.name``): the sum of an episode's turn
  rewards (0 for an episode whose step timed out or failed) and its verdict, as the episode
  driver scored them (``rljax.envs.episodes``)."""
  def score(batch: RewardBatch) -> Scored:
    if batch.episode_rewards is None:
      raise RewardSourceError("reward source 'env' scores multi-turn episodes; this batch has "
                              "single-turn completions (env.name=None)")
    return Scored(values=batch.episode_rewards, correct=batch.episode_correct)
  return score

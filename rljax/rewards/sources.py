"""Reward sources and their composition: a run's reward is a weighted sum of named sources.

A *reward source* scores a batch of completions on the host: ``source(batch) -> [B] float32``
(``batch``: a ``RewardBatch``, texts and token ids alike), or a ``Scored`` when it also knows
which rows are correct and has counts to log. Sources are registered by name,
``@register_reward_source("name")`` on ``factory(config, tokenizer, model_cfg, mesh) -> source``
(called once, when the run is built; ``model_cfg`` is the policy's architecture, ``mesh`` the
learner's, None on one device), and chosen by ``reward.sources``:

  R_i = sum_k w_k * clip_k(norm_k(x_k))_i          (then shaping, e.g. DAPO's overlong term)

with ``x_k`` [B] source ``k``'s raw scores, ``norm_k`` the batch whitening of ``reward.normalize``
(or the identity) and ``clip_k`` the clipping of ``reward.clip`` (or the identity). Each source is
logged raw as ``reward/<name>``; a weight-0 source is computed and logged and adds nothing. The
task's own source (``verifier`` for single-turn rollouts, ``env`` for multi-turn episodes) always
runs: its correct flags are the run's accuracy, dynamic sampling's pass rate and eval's pass@1.
Registered here: ``verifier`` (``reward.fn`` in killable worker processes); ``env`` is
registered by ``rljax.envs.drivers``, the judge by ``rljax.rewards.judge``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from rljax.config import reward_spec
from rljax.data.tasks import Problem
from rljax.errors import RewardSourceError
from rljax.registries import REWARD_SOURCES
from rljax.rewards import checkers

METRIC_PREFIX = "reward/"  # reward/<name>: a source's raw mean; also the host extras' keys
WHITEN_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  """What a source scores (host NumPy), ``B`` rows, groups of G contiguous.

  prompts, completions: [B] texts (a completion: the decoded text after the prompt; of an
    episode, its transcript after the first prompt).
  problems: [B] ``rljax.data.tasks.Problem`` (the answer a verifier checks against).
  prompt_tokens, prompt_mask: [B, P] the left-padded prompt ids and their mask.
  tokens, mask: [B, T] the completion ids and their mask (of an episode: the policy's tokens).
  episode_rewards, episode_correct: [B] the environment's reward and verdict of multi-turn
    episodes (None for single-turn rollouts): what the ``env`` source reports.
  """
  prompts: Sequence[str]
  completions: Sequence[str]
  problems: Sequence[Problem]
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  tokens: np.ndarray
  mask: np.ndarray
  episode_rewards: Optional[np.ndarray] = None
  episode_correct: Optional[np.ndarray] = None

  @property
  def size(self) -> int:
    return len(self.completions)


@dataclasses.dataclass(frozen=True)
class Scored:
  """A source's answer when it knows more than the values: ``correct`` [B] bool (the task's
  source), counts to log (summed over a step's rounds, e.g. ``reward/timeouts``) and failed
  calls (``checkers.FailureLog`` records)."""
  values: np.ndarray
  correct: Optional[np.ndarray] = None
  metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
  failures: tuple = ()


def register_reward_source(name: str, *, reads: Sequence[str] = (),
                           model: Optional[str] = None) -> Callable:
  """``@register_reward_source("name")`` on ``factory(config, tokenizer, model_cfg, mesh) ->
  source``: selectable in ``reward.sources`` as ``'name:weight'`` (``REWARD_SOURCES`` of
  ``rljax.registries``, filled by the modules of ``rljax.rewards`` and ``rljax.envs``). A name holds
  no ``':'``, ``','`` or ``'/'`` (the keys' separators, the metric's); ``reads``: the config keys
  only this source reads; ``model``: the role of a model it scores with (``rljax.loading.roles``:
  'judge', 'reward_model'), loaded by ``make_reward``'s ``load`` and passed as the factory's fifth
  argument."""
  if model is None:
    return REWARD_SOURCES.register(name, reads=reads)
  return REWARD_SOURCES.register(name, reads=reads, model=model)


# --- composition ---------------------------------------------------------------------------------

def whiten(x: np.ndarray, eps: float = WHITEN_EPS) -> np.ndarray:
  """Batch whitening of one source's scores, ``[B] -> [B]``: ``(x - mean) / sqrt(var + eps)``,
  mean and population variance (``ddof = 0``) over the B rows scored together."""
  x = np.asarray(x, np.float64)
  return (x - x.mean()) / np.sqrt(x.var() + eps)


def normalize(x: np.ndarray, *, whitened: bool, clip: Optional[tuple]) -> np.ndarray:
  """``clip(whiten(x))`` as ``reward.normalize`` / ``reward.clip`` declare them for a source,
  float32; the identity (``x`` itself) when neither is set."""
  if whitened:
    x = whiten(x)
  if clip is not None:
    x = np.clip(x, *clip)
  return np.asarray(x, np.float32)


@dataclasses.dataclass(frozen=True)
class Term:
  """One source of the reward: its name, weight, normalisation and the source itself."""
  name: str
  weight: float
  source: Callable
  whitened: bool = False
  clip: Optional[tuple] = None


@dataclasses.dataclass(frozen=True)
class Composed:
  """A batch's reward: ``rewards`` [B] float32 (the weighted sum, before shaping), ``correct``
  [B] bool (the task source's), ``values`` ``{name: [B] raw scores}``, ``metrics`` (the sources'
  counts) and ``failures`` (their failed calls)."""
  rewards: np.ndarray
  correct: np.ndarray
  values: Mapping[str, np.ndarray]
  metrics: Mapping[str, float]
  failures: tuple = ()

  def extras(self) -> dict:
    """``{'reward/<name>': [B] float32}``: the raw scores as host extras of the rollout."""
    return {METRIC_PREFIX + name: v for name, v in self.values.items()}


def _checked(name: str, answer, rows: int) -> Scored:
  """A source's answer as a ``Scored`` of ``rows`` finite float32 values, or one line saying
  what is wrong with it."""
  scored = answer if isinstance(answer, Scored) else Scored(answer)
  try:
    values = np.asarray(scored.values, np.float32)
  except (TypeError, ValueError) as e:
    raise RewardSourceError(f"reward source {name!r} returned {type(scored.values).__name__}, "
                            f"not an array of {rows} numbers ({e})") from None
  if values.shape != (rows,):
    raise RewardSourceError(f"reward source {name!r} returned shape {values.shape} for a batch "
                            f"of {rows} rows; expected ({rows},)")
  bad = np.flatnonzero(~np.isfinite(values))
  if bad.size:
    raise RewardSourceError(f"reward source {name!r} returned {values[bad[0]]} at row "
                            f"{bad[0]} ({bad.size} non-finite of {rows})")
  return dataclasses.replace(scored, values=values)


@dataclasses.dataclass(frozen=True)
class Reward:
  """The composed reward of ``reward.sources``: ``reward(batch) -> Composed``. ``terms`` in the
  order of ``reward.sources`` (the task's own source first when it is not named: weight 0);
  ``task``: the name of the source whose correct flags are the batch's."""
  terms: tuple
  task: str

  def __call__(self, batch: RewardBatch) -> Composed:
    rows = batch.size
    values, metrics, failures, correct, total = {}, {}, [], None, None
    for term in self.terms:
      scored = _checked(term.name, term.source(batch), rows)
      values[term.name] = scored.values
      metrics.update(scored.metrics)
      failures.extend(scored.failures)
      if term.name == self.task:
        correct = scored.correct
      if term.weight:  # a weight-0 source is logged only
        part = term.weight * normalize(scored.values, whitened=term.whitened, clip=term.clip)
        total = part if total is None else total + part
    if correct is None:
      raise RewardSourceError(f"reward source {self.task!r} (the task's own) returned no "
                              "correct flags: return a Scored with correct=[B] bools")
    return Composed(rewards=np.asarray(total, np.float32), correct=np.asarray(correct, bool),
                    values=values, metrics=metrics, failures=tuple(failures))


def make_reward(config, tokenizer, model_cfg, mesh=None, *, task_only: bool = False,
                task: Optional[str] = None, load: Optional[Callable[[str], Any]] = None
                ) -> Reward:
  """The run's ``Reward`` from ``reward.sources`` / ``normalize`` / ``clip``: each source's
  factory called once. ``task_only``: the task's own source alone, weight 1 (evaluation needs
  only its correct flags); ``task``: that source (default: the config's, ``defaults.
  task_source``; the engine's kind decides where episodes are played outside ``env.name``)."""
  task = task or reward_spec.task_source(_Facts(config))
  weights = {} if task_only else reward_spec.reward_weights(config.reward.sources)
  weights = weights or {task: 1.0}
  if task not in weights:
    weights = {task: 0.0, **weights}
  whitened = {} if task_only else reward_spec.reward_normalize(config.reward.normalize)
  clips = {} if task_only else reward_spec.reward_clip(config.reward.clip)
  terms = []
  for name, weight in weights.items():
    factory, role = REWARD_SOURCES.get(name), REWARD_SOURCES.meta(name).get("model")
    if role is not None and load is None:
      raise ValueError(f"reward source {name!r} scores with a model ({role}): make_reward needs "
                       "load (rljax.loading)")
    models = () if role is None else (load(role),)
    terms.append(Term(name=name, weight=weight,
                      source=factory(config, tokenizer, model_cfg, mesh, *models),
                      whitened=name in whitened, clip=clips.get(name)))
  return Reward(terms=tuple(terms), task=task)


class _Facts:
  """A ConfigDict read by dotted name, as the declarations' helpers read a config."""

  def __init__(self, config):
    self.config = config

  def __getitem__(self, name: str) -> Any:
    node = self.config
    for part in name.split("."):
      node = node[part]
    return node


def source_means(extras: Mapping[str, np.ndarray]) -> dict:
  """``{'reward/<name>': mean}`` of the raw scores a rollout's host extras carry."""
  return {k: float(np.mean(v)) for k, v in extras.items() if k.startswith(METRIC_PREFIX)}


def without_source_values(extras: Mapping[str, Any]) -> dict:
  """The extras less the raw scores (they are logged on the host, never sent to the devices)."""
  return {k: v for k, v in extras.items() if not k.startswith(METRIC_PREFIX)}


# --- the verifier ---------------------------------------------------------------------------------

@register_reward_source(reward_spec.VERIFIER_SOURCE)
def verifier_source(config, tokenizer, model_cfg, mesh) -> Callable:
  """The verifier ``reward.fn`` (``rljax.rewards.checkers``): each completion checked against
  its problem in killable worker processes (``reward.timeout_s``, ``reward.workers``; 0 workers:
  in the trainer's process), ``1`` if
  correct else ``reward.wrong_value``, plus ``reward.format_weight`` if well formed; its counts
  ``reward/timeouts``, ``/errors``, ``/invalid`` and its correct flags."""
  verify = checkers.task_verifier(config.reward)

  def score(batch: RewardBatch) -> Scored:
    scores = verify(list(batch.completions), list(batch.problems))
    return Scored(values=scores.rewards, correct=scores.correct, metrics=scores.metrics(),
                  failures=scores.failures)
  return score

"""A learned scalar reward model as a reward source (``reward.model.*``; docs/reward_models.md).

A frozen ``*ForSequenceClassification`` network with one label (``rljax.models`` ``head='score'``)
scores each (prompt, completion) row: ``r = h_last . w_score``. Its weights come from
``reward.model.source``: ``hf:PATH`` or an ``rljax rm`` run, ``run:DIR[@STEP]`` (its checkpoint
STEP, default the latest, as exported to ``DIR/exports/STEP``). They are placed like the
reference model (sharded by the partition rules over the run's mesh) and the rows of a batch go
through one jitted forward (rows split over the data axes; in chunks of
``reward.model.batch_size``), in ``reward.model.dtype`` (default ``model.dtype``: bfloat16 on
accelerators).

Tokens. When the reward model's tokenizer is the policy's (same ``fingerprint``: vocabulary,
merges, special ids) and prompts are rendered alike (``reward.model.chat_template`` =
``data.chat_template``), the policy's ids are scored as they are: prompt then completion, its
stop token included. Otherwise prompt and completion text are encoded again with the reward
model's tokenizer (``encode_scored``: its chat template, BOS, the completion, EOS where the
policy stopped), exactly as ``rljax rm`` encoded its training pairs. The weights and the
tokenizer are read by ``rljax.loading`` (role ``reward_model``).

Where it runs. Rewards are composed on the host after sampling, before reward shaping, dynamic
sampling (which keeps or drops groups by their rewards) and advantages: all of these need the
reward, so the model runs there, as its own jitted call, not inside the jitted ``score`` of
``rljax.learner.step``, which only starts once the batch is final.

Failures are one line each: a checkpoint that is not a sequence classifier with one label, a
tokenizer that cannot be bridged (no tokenizer named, ids beyond the model's vocabulary, text
its tokenizer cannot encode), non-finite scores (raised before the update, naming the rows).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np

from rljax.config import reward_spec
from rljax.errors import RewardSourceError, RljaxError, TokenizerError
from rljax.models import ModelConfig, transformer
from rljax.parallel import distributed, mesh as mesh_lib, rules
from rljax.rewards.sources import register_reward_source

SOURCE_KEY = "reward.model.source"
EXPORT_DIR = "hf"  # an `rljax rm` run's export of its final model
STEP_EXPORTS = "exports"  # ... and of each checkpoint: DIR/exports/<STEP>
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_MIN_WIDTH = 16


class RewardModelError(RljaxError, FloatingPointError):
  """The reward model scored rows NaN or infinite: the step stops before its update."""


def encode_scored(tokenizer, prompt, response: str, ended: bool = True) -> list[int]:
  """Ids of one row a reward model scores: the prompt as the policy sees it
  (``encode_prompt``: chat template, BOS), the response, and EOS when the response ended (a
  completion cut at the token budget has none). ``rljax rm`` encodes its pairs with it."""
  ids = tokenizer.encode_prompt(prompt) + tokenizer.encode(response)
  return ids + [tokenizer.eos_id] if ended else ids


def param_shardings(mesh, cfg: ModelConfig):
  """Where a reward model's parameters live on ``mesh``: the policy's partition rules."""
  return rules.param_shardings(mesh, transformer.logical_axes(cfg, "score"),
                               transformer.param_shapes(cfg, "score"))


@functools.lru_cache(maxsize=8)
def scoring_fn(cfg: ModelConfig, mesh) -> Callable:
  """``(params, tokens [N, S], mask [N, S]) -> scores [N]``, jitted with the parameters on their
  shardings and the rows split over the data axes (N a multiple of ``rules.batch_divisor``)."""
  return jax.jit(functools.partial(transformer.sequence_scores, cfg),
                 in_shardings=(param_shardings(mesh, cfg), rules.batch_sharding(mesh, 2),
                               rules.batch_sharding(mesh, 2)),
                 out_shardings=rules.batch_sharding(mesh, 1))


def bucket(length: int) -> int:
  """Row width of encoded rows: the next power of two (few distinct shapes to compile)."""
  return max(_MIN_WIDTH, 1 << (max(length, 1) - 1).bit_length())


@dataclasses.dataclass
class RewardModel:
  """A frozen reward model ready to score batches (``__call__``). ``policy_tokenizer``: the
  policy's; ``reuse_ids``: its ids are scored as they are (module docstring)."""
  cfg: ModelConfig
  params: Any
  tokenizer: Any
  policy_tokenizer: Any
  reuse_ids: bool
  mesh: Any
  batch_size: int = 0
  name: str = ""  # reward.model.source, for messages

  def rows(self, batch) -> tuple[np.ndarray, np.ndarray]:
    """tokens and mask [B, S] of the rows to score: the policy's prompt and completion ids
    side by side (``reuse_ids``), else the text re-encoded and left-padded."""
    if self.reuse_ids:
      tokens = np.concatenate([batch.prompt_tokens, batch.tokens], axis=1).astype(np.int32)
      mask = np.concatenate([batch.prompt_mask, batch.mask], axis=1).astype(np.int32)
      self._check_context(mask.sum(axis=1))
      return tokens, mask
    ids = [self._encode(batch, i) for i in range(len(batch.completions))]
    lengths = np.asarray([len(row) for row in ids])
    self._check_context(lengths)
    width = min(bucket(int(lengths.max())), self.cfg.max_position_embeddings)
    tokens = np.full((len(ids), width), self.tokenizer.pad_id, np.int32)
    mask = np.zeros((len(ids), width), np.int32)
    for i, row in enumerate(ids):
      tokens[i, width - len(row):] = row
      mask[i, width - len(row):] = 1
    return tokens, mask

  def _check_context(self, lengths: np.ndarray) -> None:
    """Rows [B] of ``lengths`` real tokens fit the reward model's context, or the step stops in
    one line naming the longest (a model read past its positions scores silently wrong)."""
    context, longest = self.cfg.max_position_embeddings, int(np.argmax(lengths))
    if lengths[longest] > context:
      raise RewardSourceError(
          f"{SOURCE_KEY}={self.name!r}: row {longest} is {int(lengths[longest])} tokens, more than "
          f"the reward model's context of {context} positions (max_position_embeddings); "
          "shorten the prompts or rollout.max_new_tokens")

  def _encode(self, batch, i: int) -> list[int]:
    valid = np.flatnonzero(np.asarray(batch.mask[i]))
    ended = bool(valid.size) and int(batch.tokens[i][valid[-1]]) == self.policy_tokenizer.eos_id
    try:
      return encode_scored(self.tokenizer, batch.prompts[i], batch.completions[i], ended)
    except TokenizerError as e:
      raise TokenizerError(f"{SOURCE_KEY}={self.name!r}: its tokenizer cannot encode row {i} "
                           f"(the policy's tokenizer is another one): {e}") from None

  def __call__(self, batch) -> np.ndarray:
    """Scores [B] float32 of a ``RewardBatch`` (host arrays and texts)."""
    tokens, mask = self.rows(batch)
    rows = len(tokens)
    divisor = rules.batch_divisor(self.mesh)
    chunk = min(self.batch_size or rows, rows)
    chunk = -(-chunk // divisor) * divisor
    padded = -(-rows // chunk) * chunk
    fill = np.zeros(padded - rows, np.int64)  # pad rows: copies of row 0, dropped below
    tokens, mask = (np.concatenate([x, x[fill]]) for x in (tokens, mask))
    fn = scoring_fn(self.cfg, self.mesh)
    sharding = rules.batch_sharding(self.mesh, 2)
    out = [distributed.to_host(fn(self.params, *distributed.from_host(
        (tokens[s:s + chunk], mask[s:s + chunk]), sharding))) for s in range(0, padded, chunk)]
    scores = np.concatenate(out)[:rows].astype(np.float32)
    check_finite(scores, self.name)
    return scores


def check_finite(scores: np.ndarray, name: str) -> None:
  """Stop before the update when the reward model scored rows NaN or infinite."""
  bad = ~np.isfinite(scores)
  if bad.any():
    raise RewardModelError(
        f"{SOURCE_KEY}={name!r} scored {int(bad.sum())} of {len(scores)} rows NaN or infinite "
        f"(first row {int(np.flatnonzero(bad)[0])}); the step stopped before its update: check "
        "the weights and reward.model.dtype (a float16 overflow)")


def reward_model(config, loaded, policy_tokenizer, mesh) -> RewardModel:
  """The reward model ``loaded`` (``rljax.loading``: its ModelConfig, host parameters and
  tokenizer) placed on ``mesh``, scoring the policy's rows."""
  rm = config.reward.model
  params = jax.device_put(loaded.params, param_shardings(mesh, loaded.cfg))
  reuse = (loaded.tokenizer.fingerprint() == policy_tokenizer.fingerprint()
           and bool(rm.chat_template) == bool(config.data.chat_template))
  return RewardModel(cfg=loaded.cfg, params=params, tokenizer=loaded.tokenizer,
                     policy_tokenizer=policy_tokenizer, reuse_ids=reuse, mesh=mesh,
                     batch_size=rm.batch_size, name=rm.source)


@register_reward_source(reward_spec.REWARD_MODEL_SOURCE, model="reward_model", reads=tuple(
    f"reward.model.{k}" for k in ("source", "tokenizer", "chat_template", "batch_size", "dtype")))
def reward_model_source(config, tokenizer, model_cfg, mesh, model) -> Callable:
  """A learned scalar reward model (``reward.model.*``, ``rljax.rewards.reward_model``): a
  frozen ``*ForSequenceClassification`` with one label scores each prompt and completion at its
  last token, ``r = h_last . w_score`` (the Bradley-Terry reward of ``rljax rm``; Ouyang et al.
  2022), on the learner's mesh; the policy's ids are reused when its tokenizer is the reward
  model's, else the text is re-encoded. Non-finite scores stop the step before its update."""
  del model_cfg  # the reward model has its own architecture
  if mesh is None:  # one device (an evaluation or a test builds no mesh)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape((1,) * len(mesh_lib.AXES)),
                             mesh_lib.AXES)
  return reward_model(config, model, tokenizer, mesh)

"""The LLM judge: a reward source (``'judge'`` in ``reward.sources``) that asks a language model
for a verdict on each completion (docs/reward_models.md).

The judge's prompt is ``reward.judge.template`` filled with the row's prompt and completion,
encoded as prompts are (chat template, BOS). Its verdict becomes a score by
``reward.judge.parse``:

- ``number``: the judge generates ``reward.judge.max_new_tokens`` tokens through rljax's own
  rollout engine (``reward.judge.engine``, e.g. the ``JaxEngine`` of ``all_rows``), greedy or
  sampled; the first match of
  ``reward.judge.pattern`` in the decoded verdict is the score, clipped to ``reward.judge.range``.
  A verdict without one scores ``reward.judge.fallback`` and is counted
  (``reward/judge_unparsable`` of ``reward/judge_verdicts``), never an exception; the first batch
  none of whose verdicts parsed is one warning line.
- ``p_yes``: no sampling: one forward over the judge's prompt, the score is
  ``P(yes) = softmax(z)[yes]`` of the logits ``z`` of the token after it, ``yes`` the one token of
  ``reward.judge.yes``.

The judge's weights (``reward.judge.source``): ``policy`` (the policy's own at step 0, from
``model.source``: the random 'tiny' model of the run's seed or its Hugging Face directory),
``hf:PATH`` or ``run:DIR`` (the run's export ``DIR/hf``). It reads text with the run's tokenizer,
so a judge of another vocabulary is refused. It runs frozen on the default device.

Its context holds its prompt and verdict: ``reward.judge.max_new_tokens`` at or past the judge's
``max_position_embeddings`` is refused at start-up, and a judge prompt longer than the rest
stops the step in one line (it used to run past the context silently, or out of memory).
"""
from __future__ import annotations

import functools
import logging
import re
import zlib
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.errors import RewardSourceError, StartupError
from rljax.models import transformer
from rljax.models.config import ModelConfig
from rljax.rewards.sources import RewardBatch, Scored, register_reward_source
from rljax.rollout import text as text_lib
from rljax.registries import ROLLOUT_ENGINES
from rljax.rollout.engines import Placement
from rljax.rollout.sampling import SamplingParams

JUDGE_SOURCE = "judge"  # its name in reward.sources
UNPARSABLE = "reward/judge_unparsable"
VERDICTS = "reward/judge_verdicts"  # beside it: the share that did not parse

logger = logging.getLogger(__name__)


# --- verdicts -> scores (pure) -------------------------------------------------------------------

def parse_number(verdict: str, pattern: str, lo: float, hi: float) -> Optional[float]:
  """The first match of ``pattern`` in ``verdict`` as a float (its first group when the pattern
  has groups), clipped to ``[lo, hi]``; None when nothing matches or the match is no number."""
  match = re.search(pattern, verdict)
  if match is None:
    return None
  try:
    value = float(match.group(1) if match.re.groups else match.group(0))
  except (TypeError, ValueError):
    return None
  if value != value:  # 'nan' matched by a permissive pattern
    return None
  return float(min(max(value, lo), hi))


def parse_numbers(verdicts: Sequence[str], pattern: str, lo: float, hi: float,
                  fallback: float) -> tuple[np.ndarray, int]:
  """``([B] float32 scores, count of unparsable verdicts)``: ``parse_number`` of each verdict,
  ``fallback`` where it finds none."""
  parsed = [parse_number(v, pattern, lo, hi) for v in verdicts]
  scores = np.asarray([fallback if p is None else p for p in parsed], np.float32)
  return scores, sum(p is None for p in parsed)


@functools.partial(jax.jit, static_argnames="cfg")
def next_token_logp(cfg: ModelConfig, params, tokens, mask):
  """``log softmax(z)`` [N, V] float32 of the token after each left-padded row (tokens, mask
  [N, W]): the logits at the last position (every row's last real token)."""
  hidden, model, _ = transformer.forward_with_routes(cfg, params, tokens, mask)
  logits = model.logits(hidden[:, -1:])[:, 0]
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


# --- what the judge needs of the run -------------------------------------------------------------

def check_judge(config, tokenizer, cfg: ModelConfig) -> None:
  """What the judge of architecture ``cfg`` needs of the run beside its tokenizer (checked by
  ``rljax.loading``): room in its context for a prompt beside the verdict (``parse='number'``),
  a one-token ``reward.judge.yes`` (``parse='p_yes'``). Checked from the judge's header before
  the run dir is claimed (``rljax.train.startup``) and again when it is built."""
  j = config.reward.judge
  if verdict_room(j, cfg) < 1:
    raise StartupError(
        f"reward.judge.max_new_tokens={j.max_new_tokens} leaves no room for a prompt in the "
        f"judge's context of {cfg.max_position_embeddings} positions (max_position_embeddings"
        f" of reward.judge.source={j.source!r})")
  if j.parse == "p_yes" and len(tokenizer.encode(j.yes)) != 1:
    raise StartupError(f"reward.judge.yes={j.yes!r} is {len(tokenizer.encode(j.yes))} tokens of "
                       f"data.tokenizer={config.data.tokenizer!r}; P(yes) needs one token (e.g. "
                       "'y' with the char tokenizer, ' yes' with most BPE tokenizers)")


def verdict_room(j, cfg: ModelConfig) -> int:
  """Positions of the judge's context left for its prompt: a verdict is generated after it
  (``parse='number'``)."""
  return cfg.max_position_embeddings - (j.max_new_tokens if j.parse == "number" else 0)


# --- the source ----------------------------------------------------------------------------------

def judge_prompts(batch: RewardBatch, template: str) -> list[str]:
  """The judge's prompt of each row: ``template`` filled with its prompt and completion."""
  return [template.format(prompt=p, completion=c)
          for p, c in zip(batch.prompts, batch.completions)]


def batch_key(seed: int, tokens: np.ndarray) -> jax.Array:
  """A sampled verdict's key: the run's seed and a checksum of the judge's prompt ids, so the
  same batch draws the same verdicts (a resumed run too) and different batches differ."""
  digest = zlib.crc32(np.ascontiguousarray(tokens, np.int32).tobytes())
  return jax.random.fold_in(jax.random.PRNGKey(seed), digest & 0x7FFFFFFF)


class Judge:
  """``judge(batch) -> Scored``: the score of each row by the judge model (module doc)."""

  def __init__(self, config, tokenizer, cfg: ModelConfig, params):
    j = config.reward.judge
    self.tokenizer, self.cfg, self.params = tokenizer, cfg, params
    self.template, self.parse, self.seed = j.template, j.parse, config.seed
    self.bucket = config.data.prompt_bucket
    self.warned = False  # of verdicts none of which parsed (once per run)
    # A verdict is generated in the judge's context after its prompt (parse='number').
    self.room = cfg.max_position_embeddings - (j.max_new_tokens if j.parse == "number" else 0)
    if self.room < 1:
      raise StartupError(
          f"reward.judge.max_new_tokens={j.max_new_tokens} leaves no room for a prompt in the "
          f"judge's context of {cfg.max_position_embeddings} positions (max_position_embeddings"
          f" of reward.judge.source={j.source!r})")
    if j.parse == "p_yes":
      ids = tokenizer.encode(j.yes)
      if len(ids) != 1:
        raise StartupError(f"reward.judge.yes={j.yes!r} is {len(ids)} tokens of data.tokenizer="
                           f"{config.data.tokenizer!r}; P(yes) needs one token (e.g. 'y' with "
                           "the char tokenizer, ' yes' with most BPE tokenizers)")
      self.yes_id = ids[0]
    else:
      self.pattern, self.range, self.fallback = j.pattern, tuple(j.range), j.fallback
      self.sampling = SamplingParams(
          temperature=j.temperature, greedy=j.greedy, max_new_tokens=j.max_new_tokens,
          stop_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)
      self.engine = ROLLOUT_ENGINES.get(j.engine)(config, cfg, Placement())
      self.engine.load_weights(self.engine.transfer(params)[0], 0)

  def encode(self, batch: RewardBatch) -> tuple[np.ndarray, np.ndarray]:
    """The judge's prompts, left-padded; one longer than the judge's context leaves for it
    (less the verdict's tokens) stops the step in one line naming the row."""
    ids = [self.tokenizer.encode_prompt(p) for p in judge_prompts(batch, self.template)]
    longest = max(range(len(ids)), key=lambda i: len(ids[i]))
    if len(ids[longest]) > self.room:
      verdict = (f" less reward.judge.max_new_tokens={self.cfg.max_position_embeddings - self.room}"
                 if self.parse == "number" else "")
      raise RewardSourceError(
          f"reward.judge: the judge's prompt of row {longest} is {len(ids[longest])} tokens, more "
          f"than the {self.room} its context of {self.cfg.max_position_embeddings} positions "
          f"leaves{verdict}: shorten reward.judge.template, the prompts or "
          "rollout.max_new_tokens, or use a judge of a longer context")
    return text_lib.left_pad(ids, self.bucket, self.tokenizer.pad_id)

  def verdicts(self, tokens, mask) -> list[str]:
    """The judge's generated verdicts (parse='number')."""
    out = self.engine.generate(tokens, mask, batch_key(self.seed, tokens), self.sampling, 1)
    return [self.tokenizer.decode(row[:n]) for row, n in zip(out.tokens, out.lengths)]

  def __call__(self, batch: RewardBatch) -> Scored:
    tokens, mask = self.encode(batch)
    if self.parse == "p_yes":
      logp = next_token_logp(self.cfg, self.params, jnp.asarray(tokens), jnp.asarray(mask))
      return Scored(np.exp(np.asarray(logp)[:, self.yes_id]).astype(np.float32))
    verdicts = self.verdicts(tokens, mask)
    scores, unparsable = parse_numbers(verdicts, self.pattern, *self.range, self.fallback)
    if unparsable == len(verdicts) and not self.warned:
      self.warned = True
      logger.warning(
          "reward.judge: none of the %d verdicts of a batch holds a number matching "
          "reward.judge.pattern=%r (first: %r); they score reward.judge.fallback=%g. Counted in %s "
          "(per step); this is said once", len(verdicts), self.pattern, verdicts[0][:200],
          self.fallback, UNPARSABLE)
    return Scored(scores, metrics={UNPARSABLE: float(unparsable),
                                   VERDICTS: float(len(verdicts))})


@register_reward_source(JUDGE_SOURCE, model="judge", reads=tuple(f"reward.judge.{k}" for k in (
    "source", "template", "parse", "pattern", "range", "fallback", "yes", "engine",
    "max_new_tokens", "greedy", "temperature")))
def judge_source(config, tokenizer, model_cfg, mesh, model) -> Callable:
  """An LLM judge (``reward.judge.*``, ``rljax.rewards.judge``): ``reward.judge.template`` over
  the row's prompt and completion; the score is the first number of the judge's verdict in
  ``reward.judge.range`` (``parse='number'``; unparsable verdicts score ``reward.judge.fallback``,
  counted in ``reward/judge_unparsable``) or ``P(reward.judge.yes)`` of its next token
  (``parse='p_yes'``)."""
  del model_cfg, mesh  # its own architecture (``model``, read by rljax.loading); one device
  check_judge(config, tokenizer, model.cfg)
  return Judge(config, tokenizer, model.cfg, model.params)

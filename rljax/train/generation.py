"""Problems -> scored rollouts: sample completions with the policy, verify them, shape rewards.

Used by the RL loop (``rljax.train.loop.collect_batch``) and by evaluation alike.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from rljax import rollout as rollout_lib
from rljax.parallel import distributed, rules
from rljax.rewards import shaping
from rljax.rollout.sampler import Rollout


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

  @property
  def mesh(self):
    return self.model.mesh



def generate(gen: Generator, params, problems, key, sampling: rollout_lib.SamplingParams,
             group_size: int) -> tuple[Rollout, list[str], dict]:
  """Sample ``group_size`` completions per problem and score them on the host: the sampler's
  ``Rollout`` (NumPy) with ``rewards`` (shaped), ``correct`` and ``row_valid`` added, the
  decoded completions, and the verifier's counts (``reward/timeouts``, ``/errors``,
  ``/invalid``)."""
  prompt_ids = [gen.tokenizer.encode_prompt(p.prompt) for p in problems]
  tokens, mask = rollout_lib.left_pad(prompt_ids, gen.prompt_bucket, gen.tokenizer.pad_id)
  # Every process holds the same prompts; each feeds its own rows of the global batch, and
  # every process gets all completions back (the verifiers see the whole batch).
  rows = rules.batch_sharding(gen.mesh, 2)
  tokens, mask, key = distributed.from_host((tokens, mask, np.asarray(key)),
                                            (rows, rows, rules.replicated(gen.mesh)))
  out = distributed.to_host(gen.model.sample(params, tokens, mask, key, sampling, group_size))
  out = jax.tree.map(np.asarray, out)
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

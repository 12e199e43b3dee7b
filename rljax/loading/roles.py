"""The roles a model plays in rljax, each one ``Role`` entry: which config key names its source,
which head it carries, which dtype it computes in, how its tokenizer relates to the run's.

Every role reads the one source grammar of ``rljax.config.sources`` (``tiny``, ``sft``,
``hf:PATH``, ``run:DIR[@STEP]``) through ``rljax.loading.loader``; a new role (a vision tower, a
draft model) is one entry here.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from rljax.config.sources import KINDS


@dataclasses.dataclass(frozen=True)
class Role:
  """``key``: the config key holding the source ('' where it is an argument: ``rljax.load``);
  ``head``: 'lm' (next-token logits) or 'score' (a scalar per row); ``dtype_key``: a key that
  overrides the compute dtype (None or unset: ``model.dtype``); ``tokenizer``: 'run' (it reads
  the run's ``data.tokenizer`` ids: the same vocabulary, EOS and padding), 'own' (it brings its
  own, the reward model; or ``rljax.load``'s); ``exact_vocab``: its logits are compared with the
  policy's position for position (the teacher); ``seed_offset``: a 'tiny' model's seed is
  ``seed + seed_offset``; ``adapters``: ``model.lora.*`` join it (the policy; every other role is
  read without adapters); ``policy_alias``: the value 'policy' names the policy's own source (the
  judge); ``bare_paths``: a plain directory is a source too."""
  name: str
  key: str
  kinds: tuple = KINDS
  head: str = "lm"
  dtype_key: Optional[str] = None
  tokenizer: str = "run"
  exact_vocab: bool = False
  seed_offset: int = 0
  adapters: bool = False
  policy_alias: bool = False
  bare_paths: bool = False
  settings: bool = True  # the run's model.* settings (remat, attention, ...) apply to it
  tokenizer_key: Optional[str] = None  # names its own tokenizer ('own'; else the argument)
  chat_key: Optional[str] = None  # its own tokenizer's chat template setting


ROLES = {r.name: r for r in (
    Role("policy", "model.source", adapters=True),
    Role("reference", "model.source"),  # the policy's start, frozen (without its adapters)
    Role("teacher", "teacher.source", dtype_key="teacher.dtype", exact_vocab=True, seed_offset=1),
    Role("judge", "reward.judge.source", policy_alias=True),
    Role("reward_model", "reward.model.source", head="score", dtype_key="reward.model.dtype",
         tokenizer="own", tokenizer_key="reward.model.tokenizer",
         chat_key="reward.model.chat_template"),
    Role("rm_start", "model.source", head="score", seed_offset=11),  # what `rljax rm` trains
    Role("load", "", tokenizer="own", bare_paths=True, settings=False),  # rljax.load
)}


def role(name: str) -> Role:
  if name not in ROLES:
    raise ValueError(f"unknown model role {name!r}; roles: {sorted(ROLES)}")
  return ROLES[name]

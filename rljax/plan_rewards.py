"""``rljax plan``'s part for the models a run's reward holds: the reward model (``rm`` in
``reward.sources``) and the LLM judge (``judge``). Nothing is allocated; their sources are
checked as the run checks them, from config.json and the safetensors headers (a source that does
not exist is one ``ModelFileError`` naming its key, not a plan that says FITS).

Per device (the device holding the most), as the run places them (docs/reward_models.md):

- the reward model's parameters, sharded over the learner's mesh by the partition rules like the
  reference model (resident); the RLHF demo's reward model not trained yet
  (``reward.gold.pairs``) has the policy's architecture with the score head;
- the judge's parameters, unsharded on the default device (resident);
- the reward phase, between sampling and the update: the reward model's forward over the rows it
  scores at once (``reward.model.batch_size``, else every row of a sampling round, split over the
  batch shards), one layer's activations live (``forward_bytes``: the plan's per-token figures
  of its train step, no backward); the judge's own KV cache over every row of the round (``parse='number'``: its
  prompt, the template's bytes at most plus the row's prompt and completion, and
  ``reward.judge.max_new_tokens``) or, with ``parse='p_yes'``, its forward and the float32
  next-token logits. The sources run one after the other: the phase is the larger of the two.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import numpy as np

from rljax.config.reward_spec import REWARD_MODEL_SOURCE, reward_weights
from rljax.loading import loader
from rljax.models import kv_cache as kv_cache_lib, transformer
from rljax.models.config import ModelConfig
from rljax.parallel import rules as rules_lib
from rljax.rewards import gold

@dataclasses.dataclass
class RewardPlan:
  """Bytes per device: ``resident`` (the frozen weights) and ``phase`` (the reward phase's
  peak), by part in ``bytes``, and one line per model for the report."""
  resident: int = 0
  phase: int = 0
  bytes: dict = dataclasses.field(default_factory=dict)
  lines: list = dataclasses.field(default_factory=list)


def reward_model_config(config, policy_cfg: ModelConfig) -> ModelConfig:
  """The reward model's architecture, its files checked (``rljax.loading``); the policy's while
  the RLHF demo's reward model is still to be trained."""
  if gold.cold_start_pending(config):
    return policy_cfg
  return model_config(config, "reward_model", policy_cfg)


def judge_config(config, policy_cfg: ModelConfig) -> ModelConfig:
  """The judge's architecture (the policy's for ``'policy'``), its files checked."""
  return model_config(config, "judge", policy_cfg)


def model_config(config, role: str, policy_cfg: ModelConfig) -> ModelConfig:
  """A role's architecture from its files' headers (``rljax.loading``), without any weights."""
  loader.check_files(config, role)
  return loader.architecture(config, role, policy_cfg=policy_cfg)


def plan_rewards(config, *, policy_cfg: ModelConfig, mesh, rules, rows: int, batch_shards: int,
                 prompt_len: int, forward_bytes: Callable[[ModelConfig, int, int], int]
                 ) -> RewardPlan:
  """The reward's models of ``config`` on ``mesh`` (module docstring); ``rows``: the rows of a
  sampling round, ``prompt_len``: the planned prompt length, ``forward_bytes(cfg, rows,
  width)``: one layer's live activations of a forward over ``rows`` rows ``width`` wide."""
  out = RewardPlan()
  named = reward_weights(config.reward.sources)
  width = prompt_len + config.rollout.max_new_tokens  # a policy row: prompt, completion
  dtypes = dict(dtype=policy_cfg.dtype, param_dtype=policy_cfg.param_dtype)
  if REWARD_MODEL_SOURCE in named:
    cfg = reward_model_config(config, policy_cfg).replace(**dtypes)
    shapes = transformer.param_shapes(cfg, "score")
    shardings = rules_lib.param_shardings(mesh, transformer.logical_axes(cfg, "score"), shapes,
                                          rules)
    params = rules_lib.per_device_bytes(shapes, shardings)
    scored = min(config.reward.model.batch_size or rows, rows)
    forward = forward_bytes(cfg, math.ceil(scored / batch_shards), width)
    out.bytes.update(reward_model_params=params, reward_model_forward=forward)
    out.resident += params
    out.phase = max(out.phase, forward)
    out.lines.append(f"reward model {config.reward.model.source or '(the RLHF cold start)'}: "
                     f"{cfg.num_params() / 1e6:.2f}M params, sharded like the reference")
  if "judge" in named:
    j = config.reward.judge
    cfg = judge_config(config, policy_cfg).replace(**dtypes)
    params = sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
                 for x in jax.tree.leaves(transformer.param_shapes(cfg)))
    prompt = len(j.template.encode()) + width  # an upper bound on the judge prompt's tokens
    if j.parse == "number":
      slots = prompt + j.max_new_tokens
      cache = jax.eval_shape(lambda: kv_cache_lib.init_cache(cfg, rows, slots))
      phase = sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
                  for x in jax.tree.leaves(cache))
      what = f"its KV cache [B={rows}, K={slots}]"
    else:
      phase = forward_bytes(cfg, rows, prompt) + rows * cfg.vocab_size * 4
      what = f"its forward and next-token logits [B={rows}, V={cfg.vocab_size}]"
    out.bytes.update(judge_params=params, judge_phase=phase)
    out.resident += params
    out.phase = max(out.phase, phase)
    out.lines.append(f"judge {j.source}: {cfg.num_params() / 1e6:.2f}M params, unsharded on the "
                     f"default device; {what}")
  return out

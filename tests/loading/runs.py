"""Tiny model files for the loader's tests, written without training: a Hugging Face directory
of a language model and of a reward model, a policy run directory and an `rljax rm` run
directory (config.json and committed checkpoints, as the trainers write them)."""
import json
import os

import jax
import numpy as np

from rljax import models
from rljax.config import loader as config_loader
from rljax.data import tokenizer as tokenizer_lib
from rljax.learner import initial, state as state_lib
from rljax.loading import loader
from rljax.models import transformer
from rljax.rewards import reward_model
from rljax.runs.checkpoint import Checkpointer
from tests.train import tiny

TOKENIZER = tokenizer_lib.load_tokenizer("char")


def config(extra: dict | None = None):
  """The tiny GRPO config (``tests.train.tiny``) with ``extra`` overrides."""
  merged = {**tiny.overrides("grpo"), "train.run_dir": "/tmp/unused", **(extra or {})}
  if not str(merged.get("model.source", "tiny")).startswith(("tiny", "sft")):
    merged = {k: v for k, v in merged.items() if k not in tiny.MODEL_SIZES}
  return config_loader.load_config(tiny.config_path("grpo"), list(merged.items()))


def flat(tree) -> dict:
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def same(a, b) -> bool:
  fa, fb = flat(a), flat(b)
  return fa.keys() == fb.keys() and all(np.array_equal(fa[k], fb[k]) for k in fa)


def lm_dir(path: str, seed: int = 3) -> tuple[str, dict]:
  """A tiny language model's Hugging Face directory and its parameters."""
  cfg = loader.architecture(config(), "reference", TOKENIZER)
  params = jax.device_get(transformer.init_params(cfg, seed=seed))
  models.save_hf(path, cfg, params)
  return path, params


def score_dir(path: str, seed: int = 4) -> tuple[str, dict]:
  """A tiny reward model's Hugging Face directory (a sequence classifier) and its parameters."""
  cfg = loader.architecture(config(), "reference", TOKENIZER)
  params = jax.device_get(transformer.init_params(cfg, seed=seed, head="score"))
  models.save_hf(path, cfg, params)
  return path, params


def policy_run(path: str, steps=(1, 2), extra: dict | None = None, seed: int = 5,
               lora_base: dict | None = None) -> dict:
  """A policy run directory holding checkpoints ``steps`` (different weights each); returns
  ``{step: the policy parameters saved}`` (with adapters: the adapters)."""
  settings = config(dict(extra or {}, **{"train.run_dir": path}))
  cfg = loader.architecture(settings, "policy", TOKENIZER)
  make = initial.initial_state_fn(settings, cfg, initial.resolve(settings))
  saved = {}
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(settings.to_json_best_effort(indent=2))
  with Checkpointer(os.path.join(path, "checkpoints"), keep=10, async_save=False,
                    saved=state_lib.saved_part) as ckpt:
    for step in steps:
      state = make(transformer.init_params(cfg, seed=seed + step))
      extra_record = {"data": {}, "config": json.loads(settings.to_json_best_effort())}
      if lora_base is not None:
        extra_record["lora_base"] = lora_base
      ckpt.save(step, state, extra_record, force=True)
      saved[step] = jax.device_get(state_lib.saved_part(state).params)
  return saved


def rm_run(path: str, steps=(1,)) -> dict:
  """An `rljax rm` run directory: config.json, checkpoints and their exports ``exports/STEP``;
  returns ``{step: the reward model's parameters}``."""
  settings = config({"train.run_dir": path})
  cfg = loader.architecture(settings, "reference", TOKENIZER)
  saved = {}
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(settings.to_json_best_effort(indent=2))
  with Checkpointer(os.path.join(path, "checkpoints"), keep=10, async_save=False) as ckpt:
    for step in steps:
      params = jax.device_get(transformer.init_params(cfg, seed=20 + step, head="score"))
      ckpt.save(step, {"params": params}, {"config": {}}, force=True)
      models.save_hf(os.path.join(path, reward_model.STEP_EXPORTS, str(step)), cfg, params)
      saved[step] = params
  return saved

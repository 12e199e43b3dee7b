"""Tiny run settings shared by the trainer tests (few shapes, so compiled functions are reused)."""
import os

import numpy as np

from rljax.rewards import checkers

REWARD = "test_char_sum_mod4"
if REWARD not in checkers.REWARD_FNS:
  # A reward a random policy earns about a quarter of the time, so that group estimators see a
  # reward spread (every preset really updates) and dynamic sampling has groups to drop.
  @checkers.register_reward(REWARD)
  def _char_sum_mod4(completion, problem):
    return float(sum(map(ord, completion)) % 4 == 0)

OVERRIDES = {
    "model.hidden_size": "32", "model.intermediate_size": "64", "model.num_layers": "1",
    "model.num_heads": "2", "model.num_kv_heads": "1",
    "rollout.max_new_tokens": "8", "rollout.prompts_per_step": "2", "rollout.group_size": "4",
    "rollout.temperature": "1.0",
    "data.prompt_bucket": "8", "data.num_eval": "4", "data.difficulty": "0",
    "reward.fn": REWARD, "optim.lr": "1e-3", "critic.pretrain_steps": "0",
    "train.steps": "2", "train.progress": "false", "train.export_hf": "false",
}
MODEL_SIZES = ("model.hidden_size", "model.intermediate_size", "model.num_layers",
               "model.num_heads", "model.num_kv_heads")  # read by a 'tiny'/'sft' model only
# Only where something reads them: a key set away from its default that nothing reads is an error.
CRITIC = {"critic.lr": "1e-3"}
DYNAMIC_SAMPLING = {"algo.max_gen_batches": "3"}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config_path(name: str) -> str:
  """The config file named ``name``: an algorithm preset (``configs/algos/``) or a job
  (``configs/jobs/``, e.g. ``main``)."""
  for kind in ("algos", "jobs"):
    path = os.path.join(ROOT, "configs", kind, f"{name}.py")
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(f"no configs/algos/{name}.py or configs/jobs/{name}.py")


def overrides(preset: str) -> dict:
  """The tiny settings for the config ``preset`` (``config_path``), the critic's and dynamic
  sampling's where the preset has them."""
  from rljax.config import loader as config_loader
  config = config_loader.load_config(config_path(preset))
  merged = dict(OVERRIDES)
  if config.critic.enabled:
    merged.update(CRITIC)
  if config.algo.dynamic_sampling:
    merged.update(DYNAMIC_SAMPLING)
  return merged


def args(preset: str, run_dir: str, extra: dict | None = None) -> list[str]:
  """``rljax train`` arguments for the config ``preset`` (``config_path``) at the tiny size (the
  sizes left out where ``extra`` names a checkpoint source, which brings its own architecture)."""
  merged = dict(overrides(preset), **{"train.run_dir": run_dir}, **(extra or {}))
  if not str(merged.get("model.source", "tiny")).startswith(("tiny", "sft")):
    merged = {k: v for k, v in merged.items() if k not in MODEL_SIZES}
  return (["train", "--config", config_path(preset)]
          + [f"--config.{k}={v}" for k, v in merged.items()])


def synthetic_rollout(rows: int, prompt_width: int, completion: int, vocab: int, rewards,
                      seed: int = 0):
  """A ``Rollout`` record as the host hands it to scoring: random left-padded prompts and
  completions of random lengths (row 3 has no valid completion token), the given ``rewards``."""
  from rljax.rollout.sampler import Rollout
  rng = np.random.default_rng(seed)
  prompt_len = rng.integers(2, prompt_width + 1, rows)
  comp_len = rng.integers(1, completion + 1, rows)
  comp_len[3] = 0
  tokens = rng.integers(3, vocab, (rows, prompt_width + completion)).astype(np.int32)
  prompt_mask = np.zeros((rows, prompt_width), np.int32)
  mask = np.zeros((rows, completion), np.int32)
  for i in range(rows):
    prompt_mask[i, prompt_width - prompt_len[i]:] = 1
    mask[i, :comp_len[i]] = 1
  rewards = np.asarray(rewards, np.float32)
  zeros = np.zeros((rows, completion), np.float32)
  return Rollout(prompt_tokens=tokens[:, :prompt_width], prompt_mask=prompt_mask,
                 tokens=tokens[:, prompt_width:], mask=mask, sampler_logp=zeros, draw_logp=zeros,
                 lengths=comp_len.astype(np.int32), truncated=np.zeros(rows, bool),
                 rewards=rewards, correct=rewards > 0, row_valid=np.ones(rows, np.float32))

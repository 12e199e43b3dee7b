"""The RLHF demo's cold start (``configs/tasks/rlhf.py``, docs/reward_models.md): before RL, the
hidden gold scorer (``rljax.rewards.gold``) labels preference pairs of the embedded task and
``rljax rm`` trains the reward model the run optimises, as ``model.source='sft'`` trains its
checkpoint first. Both are kept on disk: a second run reuses them.
"""
from __future__ import annotations

import contextlib
import fcntl
import os

import ml_collections

from rljax.config import loader as config_loader
from rljax.data import tokenizer as tokenizer_lib
from rljax.errors import StartupError
from rljax.rewards import gold
from rljax.rewards.reward_model import SOURCE_KEY
from rljax.runs import run_dir as run_dir_lib
from rljax.train import reward_training

EMBEDDED = "embedded:"


# The sections the reward model's training reads of the run's config (with its SFT start's:
# sft, env, rollout); a cold start that was stopped is continued by a run that differs only in
# the others (another arm of a study sharing the seed's reward model).
RM_SECTIONS = ("seed", "model", "data", "sft", "env", "rollout", "rm", "optim", "mesh", "dist",
               "train")


def rm_config(config, run_dir: str) -> ml_collections.ConfigDict:
  """The ``rljax rm`` config of the cold start: the run's, its run dir the reward model's. It
  continues what ``run_dir`` holds (a cold start killed or preempted midway), whatever the run's
  own ``train.resume``. The adapters of a LoRA policy (``model.lora.*``) are the policy's: the
  reward model is trained whole (``rljax rm`` trains no adapters), from the same cold start."""
  rm = ml_collections.ConfigDict(config.to_dict())
  config_loader.reset(rm, *(f"model.lora.{k}" for k in rm.model.lora))
  rm.train.run_dir = run_dir
  rm.train.resume = run_dir_lib.holds_run(run_dir)
  rm.train.resume_override = tuple(k for k in rm.keys() if k not in RM_SECTIONS)
  rm.train.loggers = ("jsonl",)
  return rm


def check_start(config) -> None:
  """What would stop the cold start midway, checked before the run claims its run dir (and
  before the SFT cold start the reward model starts from): embedded prompts for the gold scorer,
  an ``rm.train_file`` that is a file or can be written, a ``DIR`` that can be made. Nothing to
  check when ``DIR`` holds its export."""
  if not gold.cold_start_pending(config):
    return
  pairs = config.reward.gold.pairs
  data = config.data.source
  if not data.startswith(EMBEDDED):
    raise StartupError(f"reward.gold.pairs={pairs}: the gold scorer labels embedded tasks; "
                       f"data.source={data!r}")
  path = config.rm.train_file
  if not path:
    raise StartupError(f"reward.gold.pairs={pairs} writes its pairs to rm.train_file: set it")
  if not os.path.isfile(path):
    run_dir_lib.check_creatable(path, "rm.train_file", file=True)
  run_dir_lib.check_creatable(gold.reward_model_dir(config), SOURCE_KEY,
                              value=config.reward.model.source)


def prepare_reward_model(config, *, log=print) -> None:
  """With ``reward.gold.pairs > 0``: the pairs in ``rm.train_file`` (written when missing) and
  the reward model of ``reward.model.source='run:DIR'`` (trained into ``DIR`` when ``DIR`` holds
  no export yet). Nothing to do otherwise."""
  if not config.reward.gold.pairs:
    return
  check_start(config)
  run_dir = gold.reward_model_dir(config)
  with _exclusive(run_dir + ".lock"):  # runs of a sweep sharing it wait for the first one
    if not gold.cold_start_pending(config):
      log(f"using the reward model in {run_dir}")
      return
    _make_reward_model(config, run_dir, log)


@contextlib.contextmanager
def _exclusive(lock_path: str):
  os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
  with open(lock_path, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _make_reward_model(config, run_dir: str, log) -> None:
  pairs, data, path = config.reward.gold.pairs, config.data.source, config.rm.train_file
  if not os.path.isfile(path):
    tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
    written = gold.write_pairs(path, data[len(EMBEDDED):], config.data.difficulty, tokenizer,
                               num_pairs=pairs, seed=config.data.train_seed)
    log(f"wrote {written} gold-labelled preference pairs to {path}")
  log(f"training the reward model into {run_dir} (rljax rm)")
  result = reward_training.train_reward_model(rm_config(config, run_dir), log=log,
                                              what="in the reward model's cold start ")
  log(f"reward model: held-out pairwise accuracy {result['eval_accuracy']:.3f}")

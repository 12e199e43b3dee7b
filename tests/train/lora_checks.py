"""A tiny LoRA run of ``rljax.train.loop.train`` that checks, for every batch the learner gets, the
sampler's log-probs against the trainer's own forward under the weights of the version the batch
is tagged with (shared by tests/train/test_lora.py and the 2-device script
tests/parallel/scripts/lora_placement.py)."""
import functools
import os
import time

import jax
import numpy as np

from rljax.config import loader as config_loader
from rljax.data import tokenizer as tokenizer_lib
from rljax.models import lora, transformer
from rljax.train import build, loop
from rljax.learner import step as step_lib
from tests.train import tiny

RANK = 4
# A learning rate that moves the tiny policy visibly within a step (with B = 0 at the start, the
# first update is the adapters' first change from the base).
LORA = {"model.lora.rank": str(RANK), "model.lora.alpha": "8.0", "optim.lr": "0.05",
        "train.steps": "2"}


def config(run_dir, extra=None):
  overrides = {**tiny.overrides("grpo"), **LORA, "train.run_dir": str(run_dir), **(extra or {})}
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                   list(overrides.items()))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _logp(cfg, params, rollout, chunk):
  return step_lib.completion_stats(cfg, params, rollout, chunk)[0]


def _host(tree):
  return jax.tree.map(lambda x: np.array(jax.device_get(x)), tree)


def run(cfg, hold: bool = False):
  """``loop.train(cfg)`` recording, per learned batch: its step and version, the largest
  |sampler log-prob - trainer log-prob| over its valid tokens with the trainer's weights of that
  version, the same against the initial policy (the base), and, for the first batch, the
  |reference log-prob - base forward| of the step's scoring. Returns (train's result, records,
  the params of every version). ``hold``: each update waits until the sampler has started the
  next batch (an asynchronous sampler then samples it with weights one update old)."""
  records, versions, started = [], {}, set()
  real_learn, real_collect = loop.RunLearner.learn, loop.collect_batch

  def collect(run_, step, stream=0, **kwargs):
    started.add(step)
    return real_collect(run_, step, stream, **kwargs)

  def learn(self, batch):
    deadline = time.monotonic() + 120
    while (hold and batch.step + 1 < cfg.train.steps and batch.step + 1 not in started
           and time.monotonic() < deadline):
      time.sleep(0.01)
    run_ = self.run
    model_cfg = run_.model_cfg
    versions.setdefault(int(jax.device_get(run_.state.step)), _host(run_.state.params))
    rollout = loop.to_device(batch.rollout, run_.mesh)
    valid = (np.asarray(batch.rollout.mask) > 0) & (np.asarray(batch.rollout.row_valid)[:, None]
                                                   > 0)
    sampler = np.asarray(batch.rollout.sampler_logp)
    chunk = run_.config.model.logits_chunk
    gap = lambda params: float(np.abs(np.asarray(_logp(model_cfg, params, rollout, chunk))
                                      - sampler)[valid].max())
    record = dict(step=batch.step, version=batch.version, gap=gap(versions[batch.version]),
                  base_gap=gap(versions[0]))
    if not records:  # the KL reference is the base forward (rank 0, the initial base)
      scored, _ = run_.fns.score(run_.state, rollout, run_.algo.hparams, *run_.aux_args)
      base = lora.split_adapters(versions[0])[0]
      want = np.asarray(_logp(model_cfg.base, base, rollout, chunk))
      record["ref_gap"] = float(np.abs(np.asarray(scored.ref_logp) - want)[valid].max())
    records.append(record)
    return real_learn(self, batch)

  loop.RunLearner.learn, loop.collect_batch = learn, collect
  try:
    result = loop.train(cfg)
  finally:
    loop.RunLearner.learn, loop.collect_batch = real_learn, real_collect
  return result, records, versions


def model_config(cfg):
  """The policy's architecture (adapters included) of the run ``cfg``."""
  tokenizer = tokenizer_lib.load_tokenizer(cfg.data.tokenizer, cfg.data.chat_template)
  return build.resolve_model_config(cfg, tokenizer)


def initial_base(cfg):
  """The base the run starts from, independently: the rank-0 model of the run's seed."""
  return transformer.init_params(model_config(cfg).base, seed=cfg.seed)

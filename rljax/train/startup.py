"""Start-up checks of a run: everything that needs neither the run dir nor the weights (values,
names, the tokenizer, the prompts, the model files' headers, the mesh, whether a resume can
restore), in about a second, before ``rljax.train.build`` claims the run dir and loads."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from rljax.algorithm import Algorithm, resolve
from rljax.config import checks as config_checks
from rljax.config.reward_spec import REWARD_MODEL_SOURCE, reward_weights
from rljax.data import datasets, prompt_policy, tokenizer as tokenizer_lib
from rljax.errors import RljaxError, StartupError
from rljax.learner import state as state_lib
from rljax.learner.initial import abstract_state
from rljax.loading import loader
from rljax.parallel import distributed, mesh as mesh_lib, rules
from rljax.models import attention as attention_lib, families
from rljax.rewards import checkers, gold, judge
from rljax.rollout import sampler as sampler_lib
from rljax.runs import run_dir as run_dir_lib, trackers
from rljax.runs.checkpoint import Checkpointer
from rljax.train import selective, sft


def model_source(config) -> loader.ModelSource:
  """``model.source`` parsed (``rljax.config.sources``); a bad one is a one-line error."""
  return loader.source_of(config, "policy")


def resolve_model_config(config, tokenizer) -> loader.ModelConfig:
  """The policy's architecture from ``model.source``, without loading any weights
  (``rljax.loading.loader.architecture``)."""
  return loader.architecture(config, "policy", tokenizer)


def check_model_keys(config, algo: Algorithm, tokenizer) -> Algorithm:
  """The keys read only by some architectures (``read_if`` over the model in
  rljax/config/table.py: MoE settings on a model without MoE layers, 'tiny' sizes with a checkpoint
  source), and ``algo.router_aux_coef``'s default: None takes the checkpoint's
  ``router_aux_loss_coef``."""
  model_cfg = resolve_model_config(config, tokenizer)
  config_checks.check_unused(config, algo, model_cfg)
  if config.algo.router_aux_coef is not None or not model_cfg.moe_layers:
    return algo
  with config.unlocked():
    config.algo.router_aux_coef = float(model_cfg.router_aux_loss_coef)
  return resolve(config)



@dataclasses.dataclass
class Prepared:
  """What ``prepare`` checked and built without touching the run dir or loading weights."""
  algo: Algorithm
  tokenizer: Any
  source: Any
  mesh: Any  # the learner's
  sampler_mesh: Any = None  # the sampler's own (mesh.sampler_devices), or None: colocated


def _startup(fn, *args):
  """``fn(*args)``, with the ValueError / KeyError a start-up check of the config raises (an
  unknown name, a combination not allowed) as one ``StartupError`` line."""
  try:
    return fn(*args)
  except (KeyError, ValueError) as e:
    if isinstance(e, RljaxError):
      raise
    text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    raise StartupError(text) from e


def takes_images(config, model_cfg) -> bool:
  """Whether the run's policy and rollouts take images: a vision-language policy whose image
  prompts runs encode (``Family.run_images``; ``rljax.data.images.image_format``) sampled by a
  single-turn engine."""
  return (model_cfg.vision is not None and families.get(model_cfg.model_type).run_images
          and config.env.name is None)


def check_reward_fn(config) -> None:
  _startup(checkers.get_reward_fn, config.reward.fn)


def _check_model_files(config, algo: Algorithm, tokenizer) -> None:
  """Every model the run reads, from its files' headers (``rljax.loading.loader.check_files``):
  the policy, its PEFT adapter (``model.lora.init_from``), the transforms' frozen models and the
  reward model. A mistake there is found before the run dir is claimed, not after minutes of
  loading."""
  source = model_source(config)
  if source.kind == "run" and _same_dir(source.path, config.train.run_dir):
    raise StartupError(f"model.source={source.text!r} is this run's own train.run_dir: start "
                       "from another run's checkpoint (a run resumes its own by itself)")
  loader.check_files(config, "policy", tokenizer)
  if config.model.lora.rank and config.model.lora.init_from:
    loader.check_adapters(config, resolve_model_config(config, tokenizer))
  for t in algo.transforms:
    if t.aux_role is not None:
      loader.check_files(config, t.aux_role, tokenizer)
  if REWARD_MODEL_SOURCE in reward_weights(config.reward.sources) and \
      not gold.cold_start_pending(config):  # else trained first (rljax.train.rlhf), then read
    loader.check_files(config, "reward_model")
  if judge.JUDGE_SOURCE in reward_weights(config.reward.sources):  # was: after the run dir
    policy_cfg = resolve_model_config(config, tokenizer)
    judge_cfg = loader.check_files(config, "judge", tokenizer) or loader.architecture(
        config, "judge", tokenizer, policy_cfg=policy_cfg)
    judge.check_judge(config, tokenizer, judge_cfg)
  if config.rollout.kv_cache_bytes:  # was: a traceback at the first rollout
    # The smallest row the sampler decodes (a prompt of one bucket) must fit.
    cfg = sampler_lib.sampler_config(resolve_model_config(config, tokenizer), config.rollout.dtype)
    _startup(sampler_lib.slot_budget, cfg, 1, config.data.prompt_bucket,
             config.rollout.max_new_tokens, None, config.rollout.kv_cache_bytes)
  attention_lib.check_platform(config.model.attention)  # was: a traceback at the first call


def _same_dir(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


def _check_rows_split(config, mesh, sampler: bool = False) -> None:
  divisor = rules.batch_divisor(mesh)
  if config.rollout.prompts_per_step % divisor:
    width = (f"mesh.sampler_devices = {divisor}" if sampler else
             f"mesh {' x '.join(rules.batch_axes())} = {divisor}")
    raise StartupError(f"rollout.prompts_per_step={config.rollout.prompts_per_step} must be a "
                       f"multiple of the {'sampler' if sampler else 'data-parallel'} width "
                       f"({width})")


def prepare(config) -> Prepared:
  """Every check that needs neither the run dir nor the weights, in about a second: values,
  names, the run dir's path, the tokenizer, every prompt, the model files' headers and the mesh.
  ``loop.train`` calls it before claiming the run dir, so a mistake there leaves nothing."""
  config_checks.check_config(config)
  run_dir_lib.check_path(config.train.run_dir)
  if model_source(config).kind == "sft":  # before anything reads it or config.json records it
    sft.resolve_out_dir(config)
  algo = _startup(resolve, config)
  check_reward_fn(config)
  trackers.check_logger_packages(config)
  distributed.initialize(config.dist)
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  if model_source(config).kind == "sft":  # what would stop the cold start midway
    sft.check_cold_start(config, tokenizer)
  _check_model_files(config, algo, tokenizer)
  algo = _startup(check_model_keys, config, algo, tokenizer)
  source = datasets.make_prompt_source(
      config.data, takes_images=takes_images(config, resolve_model_config(config, tokenizer)))
  prompt_policy.apply_prompt_policy(source, config, tokenizer)  # before SFT and the model
  source = selective.selective_source(source, config)
  mesh, sampler_mesh = _startup(mesh_lib.make_meshes, config.mesh)
  _check_rows_split(config, mesh)
  if sampler_mesh is mesh:
    sampler_mesh = None
  else:
    _check_rows_split(config, sampler_mesh, sampler=True)
  check_resumable(config, algo, tokenizer)
  return Prepared(algo=algo, tokenizer=tokenizer, source=source, mesh=mesh,
                  sampler_mesh=sampler_mesh)


def check_resumable(config, algo: Algorithm, tokenizer) -> None:
  """``train.resume_override`` names keys or sections that exist. A resumed run's latest
  checkpoint must hold the state this config builds (the same arrays, of the same shapes), from
  its metadata alone: a key named in ``train.resume_override`` that changes the model or the
  optimizer state (``model.family``, a width, the critic) is refused here, before the run dir is
  claimed and its ``config.json`` rewritten, not by the restore (which would set the checkpoints
  aside as unreadable)."""
  keys = run_dir_lib.flatten_config(json.loads(config.to_json_best_effort()))
  unknown = [n for n in config.train.resume_override
             if not any(k == n or k.startswith(n + ".") for k in keys)]
  if unknown:  # a misspelt name would let nothing differ, silently
    raise StartupError(f"train.resume_override names {unknown}, which are no config keys or "
                       "sections; name them as in --config.KEY (e.g. ('optim.lr',) or ('model',))")
  run_dir = config.train.run_dir
  if not config.train.resume or not run_dir_lib.committed_steps(run_dir):
    return
  shapes, _ = abstract_state(config, resolve_model_config(config, tokenizer), algo)
  with Checkpointer(os.path.join(run_dir, "checkpoints"), keep=1, read_only=True,
                    saved=state_lib.saved_part) as ckpt:
    found = ckpt.differences(shapes, migrate=state_lib.legacy_layout)
  if found is None or not found[1]:
    return
  step, differences = found
  named = tuple(config.train.resume_override)
  saved = run_dir_lib.read_config(run_dir) or {}
  differing = [d.split(":")[0] for d in run_dir_lib.config_differences(
      saved, json.loads(config.to_json_best_effort()))] if saved else []
  changed = [k for k in differing if any(k == n or k.startswith(n + ".") for n in named)]
  more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
  raise run_dir_lib.RunDirError(
      f"cannot resume {run_dir}: its checkpoint {step} holds another train state than this config "
      f"builds ({'; '.join(differences[:3])}{more}); "
      + (f"the keys {changed} named in train.resume_override change it" if changed else
         "the config changed the model or optimizer state")
      + ": resume with the values of its config.json, or start a new run in another "
      "train.run_dir")



"""Assembling a run from its config: tokenizer, data, model, mesh, shardings, state, compiled fns.

Everything sharded is placed by ``rljax.parallel.rules`` from the parameters' logical axis names;
the same code runs on one CPU device and on a pod.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax

from rljax import models
from rljax import rollout as rollout_lib
from rljax.algorithm import Algorithm
from rljax.learner import state as state_lib, step as step_lib
from rljax.learner.initial import (abstract_state, initial_state_fn, optimizers,  # noqa: F401
                                   param_sharding, sharded_state_and_fns, single_device,
                                   state_shardings, step_spec)
from rljax.learner.state import TrainState
from rljax.loading import pin
from rljax.models import lora
from rljax.parallel import distributed
from rljax.rewards import checkers, sources as reward_sources
from rljax.rollout.engines import RolloutEngine
from rljax.runs import run_dir as run_dir_lib, trackers
from rljax.runs.checkpoint import Checkpointer
from rljax.runs.metrics import MetricsWriter, write_eval_table
from rljax.runs.plot import plot_rewards_vs_kl, plot_run
from rljax.train import policy
from rljax.train.policy import load_aux_models, load_policy, load_run_params  # noqa: F401
from rljax.train.generation import (Generator, engine_placement, env_settings,  # noqa: F401
                                    make_engine, make_generator, sampling_params)
from rljax.train.startup import (Prepared, check_model_keys,  # noqa: F401
                                 check_resumable, check_reward_fn, model_source, prepare,
                                 resolve_model_config)



@dataclasses.dataclass
class Run:
  """What one training run holds on to between steps (no logic lives here)."""
  config: Any
  algo: Algorithm
  generator: Generator
  source: Any
  fns: step_lib.StepFns
  state: TrainState
  sampling: rollout_lib.SamplingParams
  writer: MetricsWriter
  checkpointer: Checkpointer | None
  # {transform name: params} of the transforms' frozen models (the distillation teacher), never
  # trained or checkpointed; the last argument of ``fns.score`` when there is one.
  aux: Any = None
  # The learner's mesh: the train state and the scored batches live on it (the rollout engine
  # runs on its own when ``mesh.sampler_devices`` gives it devices).
  mesh: Any = None
  # The policy's architecture, adapters included (``engine.model_cfg`` is the one it samples).
  model_cfg: Any = None
  # With adapters: their frozen base as pinned at the start (``rljax.loading.pin``).
  lora_base: Any = None

  @property
  def aux_args(self) -> tuple:
    return () if not self.aux else (self.aux,)

  @property
  def engine(self) -> RolloutEngine:
    return self.generator.engine


def build_run(config, prepared: Prepared | None = None) -> Run:
  # Every key range-checked and every name resolved before any model is loaded or trained.
  prepared = prepared or prepare(config)
  algo, tokenizer, source, mesh = (prepared.algo, prepared.tokenizer, prepared.source,
                                   prepared.mesh)
  resuming = config.train.resume and bool(run_dir_lib.committed_steps(config.train.run_dir))
  model_cfg, params, lora_base = policy.pinned_policy(config, tokenizer, resuming)
  aux_cfgs, aux = policy.load_aux_models(config, algo, tokenizer, model_cfg, mesh)
  state, compiled, sharding = sharded_state_and_fns(config, model_cfg, params, mesh, algo,
                                                    aux_cfgs)
  del params

  run_dir = config.train.run_dir
  checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"),
                              keep=config.train.keep_checkpoints, saved=state_lib.saved_part)
  start = 0
  if config.train.resume and checkpointer.latest_step() is not None:
    abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            state, sharding)
    start, restored, extra = checkpointer.restore_latest(  # falls back past a bad one
        abstract, migrate=state_lib.legacy_layout)
    pin.check_record(config, extra, f"cannot resume {run_dir}")
    state = state_lib.with_base(restored, state.params)  # the frozen base, loaded above
    source.load_state_dict(extra["data"])
  elif checkpointer.latest_step() is not None:
    raise FileExistsError(f"{run_dir} already holds checkpoints: pass --config.train.resume=True "
                          "to continue it, or choose another train.run_dir")
  writer = MetricsWriter(run_dir, enabled=distributed.is_main_process(),
                         progress_total=config.train.steps, progress=config.train.progress,
                         start_step=start, loggers=trackers.factory(config))
  writer.log_config(json.loads(config.to_json_best_effort()))
  if distributed.is_main_process():
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
    if lora_base is not None:
      pin.write(run_dir, lora_base)

  engine = make_engine(config, model_cfg, prepared.sampler_mesh or mesh, tokenizer,
                       learner_mesh=mesh)
  generator = make_generator(
      config, engine, tokenizer, source, failure_log=os.path.join(run_dir, checkers.FAILURE_LOG),
      env_failure_log=os.path.join(run_dir, run_dir_lib.ENV_FAILURES_FILE), mesh=mesh)
  return Run(config=config, algo=algo, generator=generator, source=source, fns=compiled,
             state=state, sampling=sampling_params(config, tokenizer), writer=writer,
             checkpointer=checkpointer, aux=aux, mesh=mesh, model_cfg=model_cfg,
             lora_base=lora_base)


def checkpoint_extra(run, data: dict | None = None) -> dict:
  """What a checkpoint records beside the state: the data position (``data``: the position after
  the last batch the learner consumed, where an asynchronous sampler has drawn further; default:
  the prompt source's own), the config and, with adapters, their pinned base
(``rljax.loading.pin``)."""
  extra = {"data": run.source.state_dict() if data is None else data,
           "config": json.loads(run.config.to_json_best_effort())}
  if run.config.model.lora.rank:  # the state holds the adapters only: where their base is
    extra["lora_base"] = run.lora_base or pin.base_record(run.config)
  return extra


REWARDS_VS_KL = "rewards_vs_kl.png"  # in the run dir


def finish(run) -> None:
  """Final checkpoint, Hugging Face export of the policy, plot, and closing the sinks."""
  cfg = run.config
  steps = int(distributed.to_host(run.state.step))
  if run.checkpointer is not None:
    if run.checkpointer.latest_step() != steps:
      run.checkpointer.save(steps, run.state, checkpoint_extra(run), force=True)
    run.checkpointer.wait()
    run.checkpointer.close()
  # A collective: every process takes part in gathering the (possibly sharded) policy.
  params = None
  if cfg.train.export_hf:  # the merged weights (the base architecture) of a policy with adapters
    params = run.state.params
    if run.model_cfg is not None and run.model_cfg.lora_rank:
      params = lora.merge_adapters(params, run.model_cfg)
    params = distributed.to_host(params)
  if distributed.is_main_process():
    if cfg.train.export_hf:
      models.save_hf(os.path.join(cfg.train.run_dir, "hf"), run.engine.model_cfg, params)
    jsonl = os.path.join(cfg.train.run_dir, "metrics.jsonl")
    artifacts = [os.path.join(cfg.train.run_dir, name) for name in ("curves.png", "evals.csv")]
    plot_run(jsonl, artifacts[0])
    write_eval_table(jsonl, artifacts[1])
    terms = run.generator.reward.terms
    if len(terms) > 1 and cfg.algo.kl_placement != "none" and cfg.algo.ref_update == "frozen":
      # Several sources and a frozen reference (the initial policy): each source against the KL
      # from it, the over-optimisation picture when one of them is a proxy of another.
      artifacts.append(os.path.join(cfg.train.run_dir, REWARDS_VS_KL))
      plot_rewards_vs_kl({cfg.train.run_dir: jsonl}, artifacts[-1],
                         [reward_sources.METRIC_PREFIX + t.name for t in terms])
    for path in artifacts:
      run.writer.log_artifact(path)
  run.engine.close()
  run.writer.close()

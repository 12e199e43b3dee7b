"""Assembling a run from its config: tokenizer, data, model, mesh, shardings, state, compiled fns.

Everything sharded is placed by ``rljax.parallel.rules`` from the parameters' logical axis names;
the same code runs on one CPU device and on a pod.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

import jax

from rljax import models
from rljax import rollout as rollout_lib
from rljax.algorithm import Algorithm
from rljax.config.reward_spec import ENV_SOURCE, VERIFIER_SOURCE
from rljax.config.sources import ModelSource
from rljax.data import prompt_policy
from rljax.envs.episodes import EnvSettings
from rljax.envs.failures import FailureReport
from rljax.learner import state as state_lib, step as step_lib
from rljax.learner.initial import (abstract_state, initial_state_fn, optimizers,  # noqa: F401
                                   param_sharding, sharded_state_and_fns, single_device,
                                   state_shardings, step_spec)
from rljax.learner.state import TrainState
from rljax.loading import loader, pin
from rljax.models import ModelConfig, lora
from rljax.parallel import distributed, rules
from rljax.registries import EPISODE_ENGINES, ROLLOUT_ENGINES
from rljax.rewards import checkers, sources as reward_sources
from rljax.rollout.engines import EpisodeEngine, Placement, RolloutEngine
from rljax.runs import run_dir as run_dir_lib, trackers
from rljax.runs.checkpoint import Checkpointer
from rljax.runs.metrics import MetricsWriter, write_eval_table
from rljax.runs.plot import plot_rewards_vs_kl, plot_run
from rljax.train import sft
from rljax.train.generation import Generator
from rljax.train.startup import (Prepared, _startup, check_model_keys,  # noqa: F401
                                 check_resumable, check_reward_fn, model_source, prepare,
                                 resolve_model_config)


def engine_placement(model_cfg: ModelConfig, mesh, learner_mesh=None) -> Placement:
  """Where the rollout engine runs: ``mesh`` (the sampler's), rows split over its data axes and
  weights sharded by the partition rules; colocated when it is ``learner_mesh`` (or that is
  None)."""
  return Placement(
      mesh=mesh, colocated=learner_mesh is None or mesh is learner_mesh,
      row_multiple=rules.batch_divisor(mesh), data_axes=tuple(rules.batch_axes()),
      rows=rules.batch_sharding(mesh, 2), replicated=rules.replicated(mesh),
      # The sampler reads merged weights (the base layout), never the adapters themselves.
      param_sharding=param_sharding(mesh, model_cfg.base), to_device=distributed.from_host,
      to_host=distributed.to_host, context=rules.context_layout(mesh))


def make_engine(config, model_cfg: ModelConfig, mesh, tokenizer, learner_mesh=None,
                settings: EnvSettings | None = None) -> RolloutEngine:
  """The run's rollout engine, chosen once: ``rollout.engine``'s on ``mesh``, inside
  ``env.engine``'s multi-turn driver when ``env.name`` is set (``settings``: another
  environment than the config's)."""
  factory = _startup(ROLLOUT_ENGINES.get, config.rollout.engine)
  engine = _startup(factory, config, model_cfg, engine_placement(model_cfg, mesh, learner_mesh))
  _check_weight_dtype(config, engine)
  settings = settings or env_settings(config, tokenizer)
  if settings is None:
    return engine
  driver = _startup(EPISODE_ENGINES.get, settings.engine)
  return _startup(driver, engine, settings, tokenizer, config.data.prompt_bucket)


def _check_weight_dtype(config, engine) -> None:
  """``rollout.weight_dtype`` is applied by a JAX engine's weight sync (``rljax.rollout.engines.
  weight_sync``); an engine built without it would sample at full precision: refused by name."""
  dtype = config.rollout.weight_dtype
  sync = getattr(engine, "sync", None)
  if dtype is not None and getattr(sync, "weight_dtype", None) != dtype:
    raise StartupError(f"rollout.weight_dtype={dtype!r} is not applied by rollout.engine="
                       f"{config.rollout.engine!r} (its weights do not pass through "
                       "rljax.rollout.engines.weight_sync); set it to None or use all_rows / "
                       "continuous")


def env_settings(config, tokenizer) -> EnvSettings | None:
  """``env.name``'s settings (None: single-turn), its first observations limited to the model's
  context less the episode's budget (``env.max_tokens``), as prompts are."""
  settings = EnvSettings.from_config(config)
  if settings is None:
    return None
  budget, key = prompt_policy.completion_budget(config)
  limit = prompt_policy.prompt_token_limit(
      config.data.max_prompt_tokens, prompt_policy.model_context(config, tokenizer), budget, key)
  return dataclasses.replace(settings, max_prompt_tokens=limit)


def sampling_params(config, tokenizer, greedy: bool = False) -> rollout_lib.SamplingParams:
  r = config.rollout
  return rollout_lib.SamplingParams(
      temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, min_p=r.min_p, greedy=greedy,
      max_new_tokens=r.max_new_tokens, stop_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id)




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


def load_policy(config, tokenizer, *, init_from: bool = True, base: str | None = None
                ) -> tuple[ModelConfig, dict]:
  """``model.source`` read by ``rljax.loading`` (``base``: the pinned source of a resumed run
  with adapters), the 'sft' cold start trained first when ``sft.out_dir`` does not hold it yet.
  With ``model.lora.rank`` > 0 the source is the frozen base and fresh adapters join it (B = 0),
  or ``model.lora.init_from``'s (unless ``init_from=False``: adapters from a checkpoint)."""
  if model_source(config).kind == "sft":
    sft.ensure_sft_checkpoint(config, tokenizer)
  return loader.policy(config, tokenizer, with_init_from=init_from, base=base)


def load_run_params(run_dir: str, config=None, step: int | None = None, *,
                    merged: bool = True):
  """(ModelConfig, policy params) of checkpoint ``step`` of the run in ``run_dir`` (None: its
  latest): ``rljax.loading.loader.read_run`` of ``run:DIR[@STEP]``."""
  text = f"run:{run_dir}" + ("" if step is None else f"@{step}")
  return loader.read_run(ModelSource("run", run_dir, step, text), config, merged=merged,
                         who=text)


def _pinned_policy(config, tokenizer, resuming: bool):
  """(ModelConfig, params, the adapters' base record or None): the policy, its base with adapters
  pinned at the start (a 'run:DIR' source at the step it reads now) and read at that pin on a
  resume (``rljax.loading.pin``)."""
  if not config.model.lora.rank:
    return (*load_policy(config, tokenizer, init_from=not resuming), None)
  record = pin.read(config.train.run_dir) if resuming else None
  source, step = model_source(config), None
  if record is None and source.kind == "run":
    step = loader.run_step(source, f"model.source={source.text!r}")
  base = pin.pinned_source(config, record or {"step": step})
  model_cfg, params = load_policy(config, tokenizer, init_from=not resuming, base=base)
  frozen = lora.split_adapters(params)[0]
  if record is not None:
    pin.check_fingerprint(record, frozen, config.model.source)
    return model_cfg, params, record
  return model_cfg, params, pin.base_record(config, step, frozen if step is not None else None)


def load_aux_models(config, algo: Algorithm, tokenizer, model_cfg: ModelConfig, mesh):
  """The transforms' frozen models (``Transform.aux_role``, read by ``rljax.loading``):
  ``((name, ModelConfig), ...)`` and ``{name: params placed by the partition rules}`` (empty
  when no transform has one)."""
  cfgs, params = [], {}
  for t in algo.transforms:
    if t.aux_role is not None:
      loaded = loader.load(config, t.aux_role, tokenizer, policy_cfg=model_cfg)
      cfgs.append((t.name, loaded.cfg))
      params[t.name] = jax.device_put(loaded.params, param_sharding(mesh, loaded.cfg))
  return tuple(cfgs), params


def make_generator(config, engine: RolloutEngine, tokenizer, source,
                   failure_log: str | None = None,
                   env_failure_log: str | None = None, mesh=None,
                   task_only: bool = False) -> Generator:
  """``failure_log`` / ``env_failure_log``: where failed reward calls / failed episodes of a
  multi-turn engine are sampled (None: reported, not written). The reward is composed of
  ``reward.sources`` (``rljax.rewards.sources``; their factories see ``mesh``, the learner's);
  ``task_only``: of the task's own source alone (an evaluation reads only its correct flags)."""
  r = config.reward
  failures, task = None, VERIFIER_SOURCE
  if isinstance(engine, EpisodeEngine):
    failures = FailureReport(config.env.name, env_failure_log, r.max_logged_failures)
    task = ENV_SOURCE
  load = functools.partial(_reward_model, config, tokenizer, engine.model_cfg)
  reward = _startup(functools.partial(reward_sources.make_reward, task_only=task_only, task=task,
                                      load=load), config, tokenizer, engine.model_cfg, mesh)
  log = None if failure_log is None else checkers.FailureLog(failure_log, r.max_logged_failures)
  return Generator(engine=engine, tokenizer=tokenizer, reward=reward,
                   prompt_bucket=config.data.prompt_bucket, overlong_buffer=r.overlong_buffer,
                   overlong_penalty=r.overlong_penalty,
                   inflight_chunk=config.rollout.get("inflight_chunk", 0), env_failures=failures,
                   failure_log=log)


def _reward_model(config, tokenizer, policy_cfg: ModelConfig, role: str):
  """A reward source's model (the judge, the reward model) read by ``rljax.loading``."""
  return loader.load(config, role, tokenizer, policy_cfg=policy_cfg)


def build_run(config, prepared: Prepared | None = None) -> Run:
  # Every key range-checked and every name resolved before any model is loaded or trained.
  prepared = prepared or prepare(config)
  algo, tokenizer, source, mesh = (prepared.algo, prepared.tokenizer, prepared.source,
                                   prepared.mesh)
  resuming = config.train.resume and bool(run_dir_lib.committed_steps(config.train.run_dir))
  model_cfg, params, lora_base = _pinned_policy(config, tokenizer, resuming)
  aux_cfgs, aux = load_aux_models(config, algo, tokenizer, model_cfg, mesh)
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

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
import jax.numpy as jnp

from rljax.config import checks as config_checks
from rljax import models
from rljax import rollout as rollout_lib
from rljax.algorithm import Algorithm, resolve
from rljax.data import datasets, prompt_policy, tokenizer as tokenizer_lib
from rljax.data import images as images_lib
from rljax.config.reward_spec import (ENV_SOURCE, REWARD_MODEL_SOURCE, VERIFIER_SOURCE,
                                      reward_weights)
from rljax.envs.episodes import EnvSettings
from rljax.envs.failures import FailureReport
from rljax.errors import ModelFileError, RljaxError, StartupError
from rljax.models import ModelConfig, lora, transformer
from rljax.models import attention as attention_lib
from rljax.models.config import compute_dtype, run_settings
from rljax.models.peft import check_peft_adapter, load_peft_adapter
from rljax.models.source import (POLICY_SOURCES, ModelSource, check_same_tokenizer, parse_source,
                                 run_config)
from rljax.parallel import distributed, mesh as mesh_lib, rules
from rljax.rewards import sources as reward_sources
from rljax.rewards import gold, judge, reward_model, checkers
from rljax.registries import EPISODE_ENGINES, ROLLOUT_ENGINES
from rljax.rollout.engines import EpisodeEngine, Placement, RolloutEngine
from rljax.runs import run_dir as run_dir_lib
from rljax.train import selective
from rljax.train import sft
from rljax.learner import state as state_lib
from rljax.learner import step as step_lib
from rljax.runs import trackers
from rljax.learner import update as update_lib
from rljax.runs.checkpoint import Checkpointer
from rljax.train.generation import Generator
from rljax.runs.metrics import MetricsWriter, write_eval_table
from rljax.runs.plot import plot_rewards_vs_kl, plot_run
from rljax.learner.state import TrainState, create_state, make_optimizer, total_updates


def engine_placement(model_cfg: ModelConfig, mesh, learner_mesh=None) -> Placement:
  """Where the rollout engine runs: ``mesh`` (the sampler's), rows split over its data axes and
  weights sharded by the partition rules; colocated when it is ``learner_mesh`` (or that is
  None)."""
  return Placement(
      mesh=mesh, colocated=learner_mesh is None or mesh is learner_mesh,
      row_multiple=rules.batch_divisor(mesh), data_axes=tuple(rules.batch_axes()),
      rows=rules.batch_sharding(mesh, 2), replicated=rules.replicated(mesh),
      # The sampler reads merged weights (the base layout), never the adapters themselves.
      param_sharding=_param_sharding(mesh, model_cfg.base), to_device=distributed.from_host,
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


def model_source(config) -> ModelSource:
  """``model.source`` parsed (``rljax.models.source``); a bad one is a one-line error."""
  return parse_source(config.model.source, "model.source", POLICY_SOURCES)


def _hf_source(config, tokenizer, *, train_if_missing: bool) -> str | None:
  """The policy's Hugging Face directory (None: 'tiny'); 'sft' trained first when missing and
  ``train_if_missing``."""
  source = model_source(config)
  if source.kind == "sft" and train_if_missing:
    return sft.ensure_sft_checkpoint(config, tokenizer)
  return source.hf_dir(config.sft.out_dir)


def check_run_source(config, source: ModelSource) -> None:
  """A 'run:DIR[@STEP]' policy source names an rljax run (its config.json) trained with this
  config's tokenizer, holding a committed checkpoint (step ``STEP`` when given)."""
  named = f"model.source={source.text!r}"
  run_config(source.path)  # an rljax run directory at all
  run_dir_lib.check_policy_run(source.path, named)
  check_same_tokenizer(config, source.path, named)
  steps = run_dir_lib.committed_steps(source.path)
  if not steps:
    raise run_dir_lib.RunDirError(f"{named}: {source.path!r} holds no checkpoint (no committed "
                                  "step under checkpoints/); train it first")
  if source.step is not None and source.step not in steps:
    raise run_dir_lib.RunDirError(f"{named}: {source.path!r} has no checkpoint of step "
                                  f"{source.step}; its steps are {steps}")


def _same_dir(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


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


def resolve_model_config(config, tokenizer) -> ModelConfig:
  """The policy's architecture from ``model.source``, without loading any weights. The 'sft'
  cold start has the 'tiny' architecture of ``config.model`` (a stale or missing one is trained
  with it), so that is known before it exists; a run's is its own config's source's."""
  m = config.model
  source = model_source(config)
  if source.kind == "run":
    cfg = resolve_model_config(run_config(source.path), tokenizer)
    return cfg.replace(dtype=compute_dtype(m.dtype), param_dtype=m.param_dtype, **run_settings(m))
  path = _hf_source(config, tokenizer, train_if_missing=False)
  if path is None or source.kind == "sft":
    return models.tiny_config(m, tokenizer.vocab_size, eos_token_id=tokenizer.eos_id,
                              pad_token_id=tokenizer.pad_id)
  return ModelConfig.from_hf_dir(path, dtype=compute_dtype(m.dtype), param_dtype=m.param_dtype,
                                 **run_settings(m))


def load_run_params(run_dir: str, config=None, step: int | None = None, *,
                    merged: bool = True):
  """(ModelConfig, policy params) of checkpoint ``step`` in ``run_dir`` (None: the latest one
  that restores), the architecture and the state's layout from the run's config.json. A policy
  trained with low-rank adapters comes back merged, in its base architecture (its checkpoint
  holds the adapters; the base is read again from the run's ``model.source``); with
  ``merged=False`` as (its ModelConfig with the adapters, the adapter tree alone), the base not
  read."""
  config = config or run_config(run_dir)
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  model_cfg = resolve_model_config(config, tokenizer)
  checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), keep=1,
                              read_only=True, saved=state_lib.saved_part)  # never writes
  shapes, _ = abstract_state(config, model_cfg)
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                         sharding=single_device()), shapes)
  if step is None:
    _, state, extra = checkpointer.restore_latest(abstract)
  else:
    state, extra = checkpointer.restore(step, abstract)
  checkpointer.close()
  if not model_cfg.lora_rank:
    return model_cfg, state.params
  check_base_source(config, extra, f"run {run_dir!r}")
  if not merged:
    return model_cfg, lora.split_adapters(state.params)[1]
  _, base = load_policy(config, tokenizer, init_from=False)
  params = state_lib.with_base(state, base).params
  return model_cfg.base, lora.merge_adapters(params, model_cfg)


def base_record(config) -> dict:
  """What a checkpoint of a policy with adapters records about the base they were trained on
  (``checkpoint_extra``): its source and the adapters' settings."""
  m = config.model
  return {"source": m.source, "rank": m.lora.rank, "alpha": float(m.lora.alpha),
          "targets": list(m.lora.targets)}


def check_base_source(config, extra: dict, what: str) -> None:
  """The adapters of a checkpoint (``extra['lora_base']``) were trained on ``config``'s base: a
  checkpoint of adapters restored onto another base is refused in one line."""
  saved = extra.get("lora_base")
  if saved is None:
    return
  if saved.get("source") != config.model.source:
    raise run_dir_lib.RunDirError(
        f"{what}: its adapters were trained on model.source={saved.get('source')!r}, not on "
        f"model.source={config.model.source!r}; adapters of another base do not apply")


def load_policy(config, tokenizer, *, init_from: bool = True) -> tuple[ModelConfig, dict]:
  """``model.source``: 'tiny' (fresh random), 'hf:PATH', 'sft' (the cold-start checkpoint,
  trained first when ``sft.out_dir`` does not hold one yet) or 'run:DIR[@STEP]' (the policy of
  another run's latest checkpoint, or of its step ``STEP``). With ``model.lora.rank`` > 0 the
  source is the frozen base and fresh adapters join it (``lora.with_adapters``: B = 0), or the
  PEFT adapter ``model.lora.init_from`` (unless ``init_from=False``: a base whose adapters come
  from a checkpoint)."""
  cfg, params = _policy_from_source(config, tokenizer)
  path = config.model.lora.init_from if config.model.lora.rank else None
  if path and init_from:
    base, _ = lora.split_adapters(params)
    params = lora.join_adapters(base, load_peft_adapter(path, cfg))
  return cfg, params


def _policy_from_source(config, tokenizer) -> tuple[ModelConfig, dict]:
  m = config.model
  source = model_source(config)
  if source.kind == "run":
    check_run_source(config, source)
    _, params = load_run_params(source.path, step=source.step)
    cast = lambda x: x.astype(m.param_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
    cfg = resolve_model_config(config, tokenizer)
    return cfg, lora.with_adapters(cfg, jax.tree.map(cast, params), config.seed)
  path = _hf_source(config, tokenizer, train_if_missing=True)
  if path is None:
    cfg = resolve_model_config(config, tokenizer)
    return cfg, transformer.init_params(cfg, seed=config.seed)
  cfg, params = models.load_hf(path, dtype=compute_dtype(m.dtype), param_dtype=m.param_dtype)
  check_vocab(config, cfg, tokenizer)
  cfg = cfg.replace(**run_settings(m))
  return cfg, lora.with_adapters(cfg, params, config.seed)


def check_vocab(config, cfg: ModelConfig, tokenizer) -> None:
  if cfg.vocab_size < tokenizer.vocab_size:
    raise ModelFileError(
        f"model.source={config.model.source!r} has a vocabulary of {cfg.vocab_size} tokens, "
        f"fewer than data.tokenizer={config.data.tokenizer!r} ({tokenizer.vocab_size}): use the "
        "model's own tokenizer")


def single_device():
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def optimizers(config):
  updates = total_updates(config)
  actor_tx = make_optimizer(config.optim, config.optim.lr, updates)
  critic_tx = make_optimizer(config.optim, config.critic.lr, updates) \
      if config.critic.enabled else None
  return actor_tx, critic_tx


def initial_state_fn(config, model_cfg: ModelConfig, algo: Algorithm):
  """A function creating the initial TrainState from policy ``params`` (jit it with shardings).

  The critic starts from the policy trunk with a fresh value head; the reference is a copy of
  the policy, and exists only when there is a KL term and the policy has no adapters (their
  base is the reference then).
  """
  actor_tx, critic_tx = optimizers(config)

  def make(params):
    critic_params = None
    if config.critic.enabled:
      critic_params = {k: v for k, v in params.items() if k != "lm_head"}
      critic_params["value_head"] = transformer.init_params(
          model_cfg.replace(num_layers=0, vocab_size=1), seed=config.seed + 7,
          head="value")["value_head"]
    # A policy with adapters has its frozen base as the reference (``step.reference``).
    copy_ref = algo.kl_placement is not None and not model_cfg.lora_rank
    ref_params = jax.tree.map(jnp.copy, params) if copy_ref else None
    return create_state(params, critic_params=critic_params, ref_params=ref_params,
                        actor_tx=actor_tx, critic_tx=critic_tx, seed=config.seed,
                        transforms={t.name: t.init() for t in algo.transforms if t.init})
  return make


def abstract_state(config, model_cfg: ModelConfig, algo: Algorithm | None = None):
  """(TrainState of ShapeDtypeStructs, the function that makes it)."""
  make = initial_state_fn(config, model_cfg, algo or resolve(config))
  return jax.eval_shape(make, transformer.param_shapes(model_cfg)), make


def state_shardings(mesh, model_cfg: ModelConfig, state_shapes: TrainState) -> TrainState:
  """NamedShardings of every TrainState leaf by the partition rules."""
  rep = rules.replicated(mesh)
  policy = rules.param_shardings(mesh, transformer.logical_axes(model_cfg),
                                 transformer.param_shapes(model_cfg))
  def opt(shapes, params_sh):  # the trainable parameters' state (the adapters' with LoRA)
    return None if shapes is None else rules.opt_state_shardings(
        mesh, shapes, state_lib.trainable(params_sh))
  critic = None
  if state_shapes.critic_params is not None:
    critic = rules.param_shardings(mesh, transformer.logical_axes(model_cfg, "value"),
                                   transformer.param_shapes(model_cfg, "value"))
  return TrainState(
      step=rep, params=policy, opt_state=opt(state_shapes.opt_state, policy),
      critic_params=critic, critic_opt_state=opt(state_shapes.critic_opt_state, critic),
      ref_params=None if state_shapes.ref_params is None else policy,
      rng=rep, skipped_updates=rep,
      transforms=jax.tree.map(lambda _: rep, state_shapes.transforms))


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

  @property
  def aux_args(self) -> tuple:
    return () if not self.aux else (self.aux,)

  @property
  def engine(self) -> RolloutEngine:
    return self.generator.engine


def step_spec(config, model_cfg: ModelConfig, algo: Algorithm, aux_cfgs: tuple = (),
              mesh=None) -> step_lib.StepSpec:
  """The step's closure; ``aux_cfgs``: ``(transform name, architecture)`` of the transforms'
  frozen models; ``mesh`` (default: one device of the default backend) sets how rows are sharded
  and the platform that ``model.forward_tokens=-1`` and ``model.pack='auto'`` resolve for."""
  actor_tx, critic_tx = optimizers(config)
  platform = (mesh.devices.flat[0] if mesh is not None else jax.devices()[0]).platform
  forward_tokens = update_lib.forward_tokens(config.model.forward_tokens, platform)
  placed = {} if mesh is None else {"keep_rows": functools.partial(_keep_rows, mesh)}
  return step_lib.StepSpec(algo=algo, model_cfg=model_cfg, actor_tx=actor_tx, critic_tx=critic_tx,
                          logits_chunk=config.model.logits_chunk,
                          critic_clip=config.critic.value_clip, aux_cfgs=tuple(aux_cfgs),
                          seed=config.seed, forward_tokens=forward_tokens,
                          row_shards=1 if mesh is None else rules.batch_divisor(mesh),
                          side_by_side=update_lib.concurrent_chunks(config.model.parallel_chunks,
                                                                    platform),
                          pack=_pack(config, model_cfg), platform=platform,
                          context=None if mesh is None else rules.context_layout(mesh), **placed)


def _pack(config, model_cfg: ModelConfig):
  """``model.pack``; 'auto' is padded rows for a policy that takes images (the learner scores
  rows with images unpacked)."""
  return False if model_cfg.vision is not None and config.model.pack == "auto" \
      else config.model.pack


def takes_images(config, model_cfg: ModelConfig) -> bool:
  """Whether the run's policy and rollouts take images: a vision-language policy sampled by a
  single-turn engine."""
  return model_cfg.vision is not None and config.env.name is None


def _keep_rows(mesh, tree):
  return jax.lax.with_sharding_constraint(tree, rules.batch_shardings(mesh, tree))


def load_aux_models(config, algo: Algorithm, tokenizer, model_cfg: ModelConfig, mesh):
  """The transforms' frozen models: ``((name, ModelConfig), ...)`` and ``{name: params placed
  by the partition rules}`` (empty when no transform has one)."""
  cfgs, params = [], {}
  for t in algo.transforms:
    if t.aux_model is not None:
      cfg, weights = t.aux_model(config, tokenizer, model_cfg)
      cfgs.append((t.name, cfg))
      params[t.name] = jax.device_put(weights, _param_sharding(mesh, cfg))
  return tuple(cfgs), params


def _param_sharding(mesh, cfg: ModelConfig):
  return rules.param_shardings(mesh, transformer.logical_axes(cfg), transformer.param_shapes(cfg))


def sharded_state_and_fns(config, model_cfg: ModelConfig, params, mesh,
                          algo: Algorithm | None = None, aux_cfgs: tuple = ()):
  """(initial TrainState placed by the partition rules, compiled StepFns, state shardings).

  The one way a TrainState and its jitted score / train_step are made: the RL loop, notebooks,
  benchmarks and tests all call this. The compiled functions take ``(state, rollout, hp)`` with
  ``hp = algo.hparams`` (``score`` also ``{name: params}`` of the frozen models of ``aux_cfgs``).
  """
  algo = algo or resolve(config)
  shapes, make = abstract_state(config, model_cfg, algo)
  sharding = state_shardings(mesh, model_cfg, shapes)
  state = jax.jit(make, out_shardings=sharding)(params)
  mc = None
  if config.critic.enabled and config.critic.pretrain_steps:
    # Value pretraining scores rollouts with Monte-Carlo returns (lam_critic = 1).
    settings = config.to_dict()
    settings["algo"]["lam_critic"] = 1.0
    mc = step_spec(config, model_cfg, resolve(settings), aux_cfgs, mesh)
  fns = step_lib.step_fns(step_spec(config, model_cfg, algo, aux_cfgs, mesh), mc)
  aux_sharding = {name: _param_sharding(mesh, cfg) for name, cfg in aux_cfgs} or None
  compiled = step_lib.compile_step_fns(
      fns, state_sharding=sharding, rows=lambda tree: rules.batch_shardings(mesh, tree),
      replicated=rules.replicated(mesh), aux_sharding=aux_sharding)
  return state, compiled, sharding


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
  reward = _startup(functools.partial(reward_sources.make_reward, task_only=task_only, task=task),
                    config, tokenizer, engine.model_cfg, mesh)
  log = None if failure_log is None else checkers.FailureLog(failure_log, r.max_logged_failures)
  processor = None
  if takes_images(config, engine.model_cfg):
    processor = images_lib.vision_processor(
        dict(engine.model_cfg.vision), _hf_source(config, tokenizer, train_if_missing=False))
  return Generator(engine=engine, tokenizer=tokenizer, reward=reward,
                   prompt_bucket=config.data.prompt_bucket, overlong_buffer=r.overlong_buffer,
                   overlong_penalty=r.overlong_penalty,
                   inflight_chunk=config.rollout.get("inflight_chunk", 0), env_failures=failures,
                   failure_log=log, image_processor=processor)


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


def check_reward_fn(config) -> None:
  _startup(checkers.get_reward_fn, config.reward.fn)


def _check_model_files(config, algo: Algorithm, tokenizer) -> None:
  """The policy's Hugging Face directory, its PEFT adapter (``model.lora.init_from``), the
  transforms' frozen models and the reward model, from their headers: a missing or empty
  directory, an unsupported architecture, a truncated file or a wrong shape is found here, before
  the run dir is claimed, not after minutes of loading."""
  source = model_source(config)  # an unknown model.source
  if source.kind == "hf":
    check_vocab(config, _named("model.source", source.text, source.path), tokenizer)
  if source.kind == "run":
    if _same_dir(source.path, config.train.run_dir):
      raise StartupError(f"model.source={source.text!r} is this run's own train.run_dir: start "
                         "from another run's checkpoint (a run resumes its own by itself)")
    check_run_source(config, source)
  init_from = config.model.lora.init_from if config.model.lora.rank else None
  if init_from:  # the adapter against the base's architecture, from its header
    try:
      check_peft_adapter(init_from, resolve_model_config(config, tokenizer))
    except ModelFileError as e:
      raise type(e)(f"model.lora.init_from: {e}") from None
  for t in algo.transforms:
    if t.check_aux is not None:
      for key, value, path in t.check_aux(config):
        _named(key, value, path)
  if REWARD_MODEL_SOURCE in reward_weights(config.reward.sources) and \
      not gold.cold_start_pending(config):  # else trained first (rljax.train.rlhf), then read
    reward_model.check_files(config.reward.model)
  if judge.JUDGE_SOURCE in reward_weights(config.reward.sources):  # was: after the run dir
    judge.check_judge_files(config, tokenizer, resolve_model_config(config, tokenizer))
  if config.rollout.kv_cache_bytes:  # was: a traceback at the first rollout
    # The smallest row the sampler decodes (a prompt of one bucket) must fit.
    cfg = rollout_lib.sampler.sampler_config(resolve_model_config(config, tokenizer),
                                             config.rollout.dtype)
    _startup(rollout_lib.sampler.slot_budget, cfg, 1, config.data.prompt_bucket,
             config.rollout.max_new_tokens, None, config.rollout.kv_cache_bytes)
  attention_lib.check_platform(config.model.attention)  # was: a traceback at the first call


def _named(key: str, value: str, path: str) -> ModelConfig:
  try:
    return models.check_hf_dir(path)
  except ModelFileError as e:
    raise type(e)(f"{key}={value!r}: {e}") from None


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


def build_run(config, prepared: Prepared | None = None) -> Run:
  # Every key range-checked and every name resolved before any model is loaded or trained.
  prepared = prepared or prepare(config)
  algo, tokenizer, source, mesh = (prepared.algo, prepared.tokenizer, prepared.source,
                                   prepared.mesh)
  resuming = config.train.resume and bool(run_dir_lib.committed_steps(config.train.run_dir))
  model_cfg, params = load_policy(config, tokenizer, init_from=not resuming)
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
    check_base_source(config, extra, f"cannot resume {run_dir}")
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

  engine = make_engine(config, model_cfg, prepared.sampler_mesh or mesh, tokenizer,
                       learner_mesh=mesh)
  generator = make_generator(
      config, engine, tokenizer, source, failure_log=os.path.join(run_dir, checkers.FAILURE_LOG),
      env_failure_log=os.path.join(run_dir, run_dir_lib.ENV_FAILURES_FILE), mesh=mesh)
  return Run(config=config, algo=algo, generator=generator, source=source, fns=compiled,
             state=state, sampling=sampling_params(config, tokenizer), writer=writer,
             checkpointer=checkpointer, aux=aux, mesh=mesh, model_cfg=model_cfg)


def checkpoint_extra(run, data: dict | None = None) -> dict:
  """What a checkpoint records beside the state: the data position (``data``: the position after
  the last batch the learner consumed, where an asynchronous sampler has drawn further; default:
  the prompt source's own), the config and, with adapters, their base (``base_record``)."""
  extra = {"data": run.source.state_dict() if data is None else data,
           "config": json.loads(run.config.to_json_best_effort())}
  if run.config.model.lora.rank:  # the state holds the adapters only: where their base is
    extra["lora_base"] = base_record(run.config)
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

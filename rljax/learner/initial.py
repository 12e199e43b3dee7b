"""The learner's initial state and compiled step from a config: the optimizers, the TrainState
(critic, reference, the transforms' state) and where each of its arrays lives (the partition
rules), and the jitted ``score`` / ``train_step`` of ``rljax.learner.step``."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.algorithm import Algorithm, resolve
from rljax.learner import packing
from rljax.learner import state as state_lib
from rljax.learner import step as step_lib
from rljax.learner import update as update_lib
from rljax.learner.state import TrainState, create_state, make_optimizer, total_updates
from rljax.models import ModelConfig, transformer
from rljax.parallel import rules


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
                        transforms={t.name: t.init() for t in algo.transforms if t.init},
                        model_cfg=model_cfg)
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
  def opt(shapes, params_sh, cfg):  # the trainable parameters' state (the adapters' with LoRA)
    return None if shapes is None else rules.opt_state_shardings(
        mesh, shapes, state_lib.trainable(params_sh, cfg))
  critic = None
  if state_shapes.critic_params is not None:
    critic = rules.param_shardings(mesh, transformer.logical_axes(model_cfg, "value"),
                                   transformer.param_shapes(model_cfg, "value"))
  return TrainState(
      step=rep, params=policy, opt_state=opt(state_shapes.opt_state, policy, model_cfg),
      critic_params=critic, critic_opt_state=opt(state_shapes.critic_opt_state, critic, None),
      ref_params=None if state_shapes.ref_params is None else policy,
      rng=rep, skipped_updates=rep,
      transforms=jax.tree.map(lambda _: rep, state_shapes.transforms))


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
                          pack=packing.pack_setting(config.model.pack, model_cfg),
                          platform=platform,
                          context=None if mesh is None else rules.context_layout(mesh), **placed)


def _keep_rows(mesh, tree):
  return jax.lax.with_sharding_constraint(tree, rules.batch_shardings(mesh, tree))


def param_sharding(mesh, cfg: ModelConfig):
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
  aux_sharding = {name: param_sharding(mesh, cfg) for name, cfg in aux_cfgs} or None
  compiled = step_lib.compile_step_fns(
      fns, state_sharding=sharding, rows=lambda tree: rules.batch_shardings(mesh, tree),
      replicated=rules.replicated(mesh), aux_sharding=aux_sharding)
  return state, compiled, sharding

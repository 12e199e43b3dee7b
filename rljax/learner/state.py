"""The training state pytree and its optimizers."""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from rljax.algos.entropy import EntropyCtrlState
from rljax.models import lora


@flax.struct.dataclass
class TrainState:
  """Everything a run needs to continue: a checkpoint is exactly this pytree.

  ``critic_*`` are None without a critic; ``ref_params`` is None when ``algo.kl_placement`` is
  ``none`` (no reference model is even built) and when the policy has low-rank adapters (its
  reference is its own frozen base, ``reference``). With adapters ``params`` holds the base and
  the adapters (``rljax.models.lora``), ``opt_state`` the adapters' only (``trainable``), and a
  checkpoint the adapters only (``saved_part``); a frozen vision tower
  (``model.vision.trainable=False``) has no optimizer state either. ``transforms``:
  ``{name: state}`` of the resolved transforms that keep state (the KL coefficient, the entropy
  controller, ...), checkpointed with the rest so that a resumed run continues them.
  """
  step: jax.Array  # int32 [], RL steps completed
  params: Any
  opt_state: Any
  critic_params: Any
  critic_opt_state: Any
  ref_params: Any
  rng: jax.Array  # uint32 [2]
  skipped_updates: jax.Array  # int32 [], optimizer steps skipped for a non-finite loss/gradient
  transforms: Any = flax.struct.field(default_factory=dict)


def frozen_entries(cfg) -> tuple[str, ...]:
  """The top-level parameter entries that no update touches outside LoRA: the vision tower
  (``visual``) of a policy with ``model.vision.trainable=False``."""
  frozen_tower = cfg is not None and cfg.vision is not None and not cfg.vision_trainable
  return (lora.TOWER,) if frozen_tower else ()


def trainable(params, cfg):
  """What the optimizer updates (``cfg``: the policy's ``ModelConfig``, or None for a model with
  nothing frozen): the adapters when ``params`` has any (the base is frozen: no gradient, no
  optimizer state), else every parameter but the ``frozen_entries``."""
  base, adapters = lora.split_adapters(params)
  if adapters:
    return adapters
  frozen = frozen_entries(cfg)
  return {k: v for k, v in params.items() if k not in frozen} if frozen else params


def with_trainable(params, new, cfg):
  """``params`` with its ``trainable`` part replaced by ``new`` (the frozen part untouched)."""
  base, adapters = lora.split_adapters(params)
  if adapters:
    return lora.join_adapters(base, new)
  frozen = frozen_entries(cfg)
  return {**new, **{k: params[k] for k in frozen if k in params}} if frozen else new


def saved_part(state: "TrainState") -> "TrainState":
  """What a checkpoint holds of ``state`` (or of its abstract): everything, except that of a
  policy with adapters only the adapters are kept (the base is read again from its source,
  recorded beside the checkpoint; ``with_base``)."""
  if not isinstance(state, TrainState) or not isinstance(state.params, dict):
    return state
  base, adapters = lora.split_adapters(state.params)
  return state.replace(params=adapters) if adapters else state


def with_base(restored: "TrainState", base: dict) -> "TrainState":
  """A restored ``saved_part`` with the frozen ``base`` (a parameter tree without adapters, or
  with them: they are replaced) put back."""
  if not lora.has_adapters(restored.params):
    return restored
  return restored.replace(params=lora.join_adapters(lora.split_adapters(base)[0],
                                                    restored.params))


def learning_rate_schedule(optim_cfg, peak_lr: float, total_updates: int) -> optax.Schedule:
  """Linear warmup over ``optim.warmup_steps`` updates, then constant or cosine decay to 0."""
  warmup = optim_cfg.warmup_steps
  if optim_cfg.schedule == "constant":
    after = optax.constant_schedule(peak_lr)
  elif optim_cfg.schedule == "cosine":
    after = optax.cosine_decay_schedule(peak_lr, max(total_updates - warmup, 1))
  else:
    raise ValueError(f"optim.schedule must be 'constant' or 'cosine', got {optim_cfg.schedule!r}")
  if warmup <= 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak_lr, warmup), after], [warmup])


def make_optimizer(optim_cfg, peak_lr: float, total_updates: int) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW (``optim.*``); ``max_grad_norm <= 0`` disables clipping."""
  adamw = optax.adamw(learning_rate_schedule(optim_cfg, peak_lr, total_updates),
                      b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
                      weight_decay=optim_cfg.weight_decay)
  if optim_cfg.max_grad_norm and optim_cfg.max_grad_norm > 0:
    return optax.chain(optax.clip_by_global_norm(optim_cfg.max_grad_norm), adamw)
  return adamw


def total_updates(config) -> int:
  """Optimizer steps of the whole run: one per minibatch, epochs x minibatches per RL step."""
  return config.train.steps * config.algo.epochs * config.algo.minibatches


def create_state(params, *, critic_params=None, ref_params=None, actor_tx, critic_tx,
                 seed: int, transforms=None, model_cfg=None) -> TrainState:
  """A fresh TrainState; the reference starts as a copy of the policy when one is needed.
  ``transforms``: the initial state of each transform that keeps one. The optimizer state is
  the ``trainable`` parameters' of ``model_cfg`` (the adapters' only, with LoRA; none for a
  frozen tower)."""
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=actor_tx.init(trainable(params, model_cfg)),
      critic_params=critic_params,
      critic_opt_state=None if critic_params is None else critic_tx.init(critic_params),
      ref_params=ref_params,
      rng=jax.random.PRNGKey(seed),
      skipped_updates=jnp.zeros((), jnp.int32),
      transforms=dict(transforms or {}))


# Checkpoints written before the transforms owned their state kept the KL coefficient and the
# entropy controller as TrainState fields of their own.
LEGACY_FIELDS = {"kl_coef": ("kl_coef", "coef"), "entropy_ctrl": ("entropy_ctrl", None)}


def legacy_layout(saved_paths: set, abstract: TrainState):
  """``(abstract of the older layout, convert)`` when a checkpoint has top-level ``kl_coef`` /
  ``entropy_ctrl`` (``Checkpointer.restore``'s ``migrate``), else None. A field the current
  config has no transform for is dropped (the KL coefficient of a run whose KL is now off)."""
  if not any(p == "kl_coef" or p.startswith("entropy_ctrl/") for p in saved_paths):
    return None
  fields = {f: getattr(abstract, f) for f in abstract.__dataclass_fields__ if f != "transforms"}
  old = dict(fields)
  scalar = jax.tree.leaves(abstract.step)[0]
  old["kl_coef"] = jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar.sharding)
  old["entropy_ctrl"] = None
  if any(p.startswith("entropy_ctrl/") for p in saved_paths):
    value = jax.ShapeDtypeStruct((), jnp.result_type(float), sharding=scalar.sharding)
    old["entropy_ctrl"] = EntropyCtrlState(value, value, value)

  def convert(restored) -> TrainState:
    transforms = {}
    for field, (name, leaf) in LEGACY_FIELDS.items():
      if name in abstract.transforms and restored[field] is not None:
        transforms[name] = {leaf: restored[field]} if leaf else restored[field]
    return TrainState(**{f: restored[f] for f in fields}, transforms=transforms)
  return old, convert

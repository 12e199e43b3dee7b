"""The training state pytree and its optimizers."""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rljax.algos.entropy import entropy_ctrl_init


@flax.struct.dataclass
class TrainState:
  """Everything a run needs to continue: a checkpoint is exactly this pytree.

  ``critic_*`` are None without a critic; ``ref_params`` is None when ``algo.kl_placement`` is
  ``none`` (no reference model is even built). ``kl_coef`` is the (possibly adaptive) KL weight.
  """
  step: jax.Array  # int32 [], RL steps completed
  params: Any
  opt_state: Any
  critic_params: Any
  critic_opt_state: Any
  ref_params: Any
  kl_coef: jax.Array  # float32 []
  rng: jax.Array  # uint32 [2]
  skipped_updates: jax.Array  # int32 [], optimizer steps skipped for a non-finite loss/gradient
  # Skywork-OR1 adaptive entropy coefficient (ALGORITHMS.md 8.7): an EntropyCtrlState, or None
  # when algo.entropy_ctrl is off. Checkpointed with the rest, so a resumed run continues it.
  entropy_ctrl: Any = None


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
                 kl_coef: float, seed: int, entropy_coef: float | None = None) -> TrainState:
  """A fresh TrainState; the reference starts as a copy of the policy when one is needed.
  ``entropy_coef``: the adaptive entropy controller's ``c_0`` (None: no controller)."""
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=actor_tx.init(params),
      critic_params=critic_params,
      critic_opt_state=None if critic_params is None else critic_tx.init(critic_params),
      ref_params=ref_params,
      kl_coef=jnp.asarray(kl_coef, jnp.float32),
      rng=jax.random.PRNGKey(seed),
      skipped_updates=jnp.zeros((), jnp.int32),
      entropy_ctrl=None if entropy_coef is None else entropy_ctrl_init(entropy_coef))

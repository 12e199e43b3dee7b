"""Skywork-OR1's adaptive entropy coefficient (docs/algorithms.md; He et al., arXiv 2505.22312):
the entropy bonus's weight as state, stepped once per RL step with the step's measured entropy."""
import jax.numpy as jnp

from rljax.algos import entropy as entropy_lib
from rljax.algos.losses import entropy_bonus_mask, scalar_metric, token_metrics
from rljax.transforms.base import Transform, register_transform, traced

H_UPDATE = "entropy_ctrl/H_update"


@register_transform("entropy_ctrl", order=20, reads=(
    "entropy_ctrl", "entropy_ctrl_estimate", "entropy_coef", "entropy_target",
    "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max"))
def make(algo, hparams):
  """Skywork-OR1's adaptive entropy coefficient (He et al., arXiv 2505.22312), with
  ``algo.entropy_ctrl``: the entropy bonus's weight ``c`` (from ``c_0 = algo.entropy_coef``) is
  state; after each RL step with measured entropy ``e``, ``low = e < target``,
  ``c <- clip(c + delta if low else c - delta, c_min, c_max)`` and the next step applies
  ``alpha = c low``. ``e``: ``full`` (token-mean ``H`` of the step's forwards, TRL) or ``sampled``
  (``-token-mean(old_logp)``, Skywork). Logs ``entropy_ctrl/coef``, ``/applied``, ``/measured``,
  ``/active``."""
  if not algo["entropy_ctrl"]:
    return None
  if not algo["entropy_coef_min"] <= algo["entropy_coef_max"]:
    raise ValueError(f"algo.entropy_coef_min={algo['entropy_coef_min']!r} must be <= "
                     f"algo.entropy_coef_max={algo['entropy_coef_max']!r}")
  keys = traced(hparams, algo, "entropy_target", "entropy_coef_delta", "entropy_coef_min",
                "entropy_coef_max")
  sampled = algo["entropy_ctrl_estimate"] == "sampled"

  def on_loss(arrays):
    # 8.7's "full" measure: H of every forward, over the tokens the bonus sees.
    measured = entropy_bonus_mask(arrays["mask"], arrays.get("entropy_keep"))
    return {H_UPDATE: token_metrics(measured, v=arrays["entropy"])["v"]}

  def on_step(state, hp, batch, metrics):
    measured = (entropy_lib.sampled_entropy(batch.old_logp, batch.loss_mask) if sampled
                else metrics[H_UPDATE])
    new, scalars = step_controller(hp, state, *measured)
    return new, {k: scalar_metric(v) for k, v in scalars.items()}

  return Transform(
      "entropy_ctrl", keys=("entropy_ctrl", "entropy_ctrl_estimate", "entropy_coef") + keys,
      needs_old_logp=sampled, drives=("entropy_coef",),
      init=lambda: entropy_lib.entropy_ctrl_init(algo["entropy_coef"]),
      coefs=lambda state: {"entropy_coef": state.applied.astype(jnp.float32)},
      on_loss=on_loss, on_step=on_step)


def step_controller(hp, state, measured_sum, measured_count):
  """The controller stepped with a step's measured entropy (a step without a valid token keeps
  the state), and the step's ``entropy_ctrl/`` scalars."""
  measured = measured_sum / jnp.maximum(measured_count, 1)
  stepped = entropy_lib.entropy_ctrl_step(
      state, measured, target=hp["entropy_target"], delta=hp["entropy_coef_delta"],
      coef_min=hp["entropy_coef_min"], coef_max=hp["entropy_coef_max"])
  new = entropy_lib.EntropyCtrlState(*(jnp.where(measured_count > 0, a, b)
                                       for a, b in zip(stepped, state)))
  # ``applied``: the coefficient this step trained with (alpha_k); ``coef``: the new state c.
  return new, {"entropy_ctrl/coef": new.coef, "entropy_ctrl/applied": state.applied,
               "entropy_ctrl/measured": measured,
               "entropy_ctrl/active": (state.applied > 0).astype(new.coef.dtype)}

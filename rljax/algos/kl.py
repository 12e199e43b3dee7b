"""KL regularisers (docs/algorithms.md sections 1 and 5).

Estimators follow Schulman, "Approximating KL divergence" (2020), with the gradient pitfalls of
arXiv 2506.09477 in mind: each is an elementwise function ``k(logp, ref_logp)`` of the sampled
tokens' log-probs ``[B, T]`` whose *gradient* w.r.t. ``logp`` is what the loss uses.
"""

import chex
import jax
import jax.numpy as jnp

from rljax.algos.advantages import outcome_token_rewards
from rljax.algos.registry import KL_ESTIMATORS, register_kl_estimator, register_regularizer

K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0
ADAPTIVE_KL_STEP_CLIP = 0.2


@register_kl_estimator("k1")
def k1(logp: chex.Array, ref_logp: chex.Array) -> chex.Array:
  """``k1 = logp - ref_logp`` (Schulman, "Approximating KL divergence", 2020): unbiased value,
  high variance."""
  return logp - ref_logp


@register_kl_estimator("k2")
def k2(logp: chex.Array, ref_logp: chex.Array) -> chex.Array:
  """``k2 = 0.5 (logp - ref_logp)^2`` (Schulman 2020): its gradient is the unbiased reverse-KL
  gradient (arXiv 2506.09477)."""
  return 0.5 * (logp - ref_logp) ** 2


@register_kl_estimator("k3")
@register_kl_estimator("low_var_kl")
def k3(logp: chex.Array, ref_logp: chex.Array) -> chex.Array:
  """``k3 = exp(x) - x - 1``, ``x = clip(ref_logp - logp, -20, 20)``, result clipped to [-10, 10].

  Non-negative, low variance (GRPO 2402.03300 uses it in the loss).
  """
  x = jnp.clip(ref_logp - logp, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
  return jnp.clip(jnp.exp(x) - x - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


@register_kl_estimator("k3+")
def k3_plus(logp: chex.Array, ref_logp: chex.Array) -> chex.Array:
  """Straight-through ``k3+``: the value of ``k3`` with the gradient of ``k2`` (arXiv 2506.09477).

  ``k3+ = k2 + sg(k3 - k2)``.
  """
  quad = k2(logp, ref_logp)
  return quad + jax.lax.stop_gradient(k3(logp, ref_logp) - quad)


def kl_estimate(estimator: str, logp: chex.Array, ref_logp: chex.Array) -> chex.Array:
  """The registered estimator ``estimator`` (``algo.kl_estimator``), elementwise ``[B, T]``."""
  chex.assert_equal_shape([logp, ref_logp])
  return KL_ESTIMATORS.get(estimator)(logp, ref_logp)


def kl_reward_penalty(mask: chex.Array, old_logp: chex.Array, ref_logp: chex.Array, *,
                      kl_coef: float, estimator: str) -> chex.Array:
  """The per-token KL reward ``-beta sg(k(old_logp, ref_logp)) m`` ``[B, T]``
  (``algo.kl_placement='reward'``). The KL is measured at the rollout policy (``old_logp``) and is
  a reward: no gradient flows. Outcome estimators read ``R_i`` plus its sum over the row."""
  chex.assert_rank([mask, old_logp, ref_logp], [2, 2, 2])
  chex.assert_equal_shape([mask, old_logp, ref_logp])
  penalty = -kl_coef * jax.lax.stop_gradient(kl_estimate(estimator, old_logp, ref_logp))
  return jnp.where(mask > 0, penalty, 0)


def kl_reward_tokens(rewards: chex.Array, mask: chex.Array, old_logp: chex.Array,
                     ref_logp: chex.Array, *, kl_coef: float, estimator: str) -> chex.Array:
  """KL in the reward for token-level estimators (GAE, REINFORCE++): per-token rewards
  ``[B, T]``, ``kl_reward_penalty`` on every token plus ``R_i`` on the last valid token."""
  chex.assert_rank(rewards, 1)
  outcome = outcome_token_rewards(rewards, mask)
  penalty = kl_reward_penalty(mask, old_logp, ref_logp, kl_coef=kl_coef, estimator=estimator)
  return outcome + penalty.astype(outcome.dtype)


@register_regularizer("kl", hparams={"estimator": "kl_estimator"}, coef="kl_coef",
                      agg=lambda algo: "token_mean" if algo["kl_normalize"] else "policy",
                      enabled=lambda algo: algo["kl_placement"] == "loss")
def kl_penalty(logp: chex.Array, ref_logp: chex.Array, *, estimator: str) -> chex.Array:
  """KL in the loss (``algo.kl_placement='loss'``): ``k(logp, ref_logp)`` ``[B, T]``, added as
  ``beta * agg(k)``. Aggregated like the policy loss, or per valid token (``token_mean``) with
  ``algo.kl_normalize`` (T1, arXiv 2501.11651: its weight does not grow with length; the paper's
  exact form is not public, this is the project's reading)."""
  return kl_estimate(estimator, logp, ref_logp)


def adaptive_kl_coef(beta: chex.Numeric, kl: chex.Numeric, *, target: float, horizon: float,
                     n: chex.Numeric) -> chex.Array:
  """Adaptive KL controller (Ziegler et al. 2019, used by PPO-RLHF).

  ``beta <- beta (1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon)``, ``n`` the number of
  samples (rollouts) the KL was measured on. Pure: the trainer keeps ``beta`` in its state.
  """
  error = jnp.clip(kl / target - 1.0, -ADAPTIVE_KL_STEP_CLIP, ADAPTIVE_KL_STEP_CLIP)
  return beta * (1.0 + error * n / horizon)


def ema_update(ref_params: chex.ArrayTree, params: chex.ArrayTree, decay: float
               ) -> chex.ArrayTree:
  """EMA reference (T1 "dynamic anchor", arXiv 2501.11651), over any pytree.

  ``theta_ref <- d theta_ref + (1 - d) theta``, after each optimizer step; keeps ``ref``'s dtypes.
  """
  chex.assert_trees_all_equal_structs(ref_params, params)

  def update(ref, new):
    # Mix in at least float32 so a bfloat16 reference still moves when 1 - d is small.
    dtype = jnp.promote_types(jnp.promote_types(ref.dtype, new.dtype), jnp.float32)
    mixed = decay * ref.astype(dtype) + (1.0 - decay) * new.astype(dtype)
    return mixed.astype(ref.dtype)

  return jax.tree.map(update, ref_params, params)

"""Value model loss and VAPO's positive-example LM loss (docs/algorithms.md sections 5 and 6).

Shapes: ``[B, T]`` rows x completion tokens; ``V[i, t]`` is the value of the state before
completion token t; ``mask[B, T]`` is 1 on real completion tokens. Losses are ``(sum, count)``
pairs: sum the parts over micro-batches, divide once by the count of the whole minibatch.
"""
from typing import Optional, Tuple

import chex
import jax.numpy as jnp

from rljax.algos.losses import Metrics, token_metrics
from rljax.algos.registry import register_regularizer


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))


def value_loss_sum(values: chex.Array, old_values: chex.Array, returns: chex.Array,
                   mask: chex.Array, *, clip: Optional[float]) -> Tuple[chex.Array, Metrics]:
  """Clipped value loss (PPO 1707.06347; VC-PPO 2503.01491), the ``sum`` of a ``token_mean``.

  ``0.5 max((V - ret)^2, (clip(V, V_old - c, V_old + c) - ret)^2)`` summed over valid tokens
  (``clip=None``: the unclipped ``0.5 (V - ret)^2``). Metrics: ``value_clip_frac`` = fraction of
  valid tokens where the clipped term is the larger one (its gradient is then 0).

  The clipped value is built as ``clip(V, V_old - c, V_old + c)`` (verl, TRL), not
  ``V_old + clip(V - V_old, -c, c)``: the latter differs from ``V`` by one rounding inside the
  range, so ``clipped > unclipped`` would count tokens that were never clipped.
  """
  _check_tokens(values, old_values, returns, mask)
  unclipped = (values - returns) ** 2
  if clip is None:
    loss = unclipped
    active = jnp.zeros(mask.shape, values.dtype)
  else:
    clipped_values = jnp.clip(values, old_values - clip, old_values + clip)
    clipped = (clipped_values - returns) ** 2
    loss = jnp.maximum(unclipped, clipped)
    active = (clipped > unclipped).astype(values.dtype)
  total = jnp.where(mask > 0, 0.5 * loss, 0).sum()
  return total, token_metrics(mask, value_clip_frac=active)


def value_loss_count(mask: chex.Array) -> chex.Array:
  """Denominator of ``value_loss_sum``: number of valid tokens of the whole minibatch."""
  chex.assert_rank(mask, 2)
  return (mask > 0).sum().astype(jnp.result_type(float))


def explained_variance(values: chex.Array, returns: chex.Array, mask: chex.Array) -> chex.Array:
  """``1 - Var[ret - V] / Var[ret]`` over valid tokens (a scalar; 0 when ``Var[ret] = 0``).

  A ratio of variances, not a mean: compute it once on a whole batch, not per micro-batch.
  """
  _check_tokens(values, returns, mask)
  valid = mask > 0
  n = jnp.maximum(valid.sum(), 1)

  def var(x):
    mean = jnp.where(valid, x, 0).sum() / n
    return (jnp.where(valid, x - mean, 0) ** 2).sum() / n

  var_returns = var(returns)
  ratio = var(returns - values) / jnp.where(var_returns > 0, var_returns, 1)
  return jnp.where(var_returns > 0, 1.0 - ratio, 0.0)


def positive_example_rows(rewards: chex.Array) -> chex.Array:
  """VAPO (arXiv 2504.05118) positive examples ``[B]`` bool: ``R_i == max R`` and ``max R > min R``.

  Computed once on the rollout batch (the "batch's top reward"), then sliced like the other
  per-row inputs; a batch whose rewards are all equal has no positive example.
  """
  chex.assert_rank(rewards, 1)
  top = rewards.max()
  return (rewards == top) & (top > rewards.min())


def positive_rows_mask(mask: chex.Array, positive: chex.Array) -> chex.Array:
  """The valid tokens of the positive rows ``[B, T]`` (``positive[B]``, see
  ``positive_example_rows``): the tokens VAPO's positive-example LM loss averages over."""
  chex.assert_rank([mask, positive], [2, 1])
  chex.assert_equal_shape_prefix([positive, mask], 1)
  return jnp.where(positive[:, None] > 0, mask, jnp.zeros((), mask.dtype))


@register_regularizer("pos_lm", coef="pos_lm_coef", agg="token_mean", token_mask=positive_rows_mask)
def positive_lm_nll(logp: chex.Array) -> chex.Array:
  """VAPO (arXiv 2504.05118) positive-example LM loss: the NLL ``l = -logp`` ``[B, T]``, averaged
  over the tokens of the positive rows (``positive_rows_mask``: the completions with the top
  reward) and added as ``mu * NLL``, ``mu = algo.pos_lm_coef``."""
  return -logp

"""ReMax: the greedy-rollout baseline (docs/algorithms.md; Li et al., arXiv 2310.10505; verl
``compute_remax_outcome_advantage``).

One extra greedy (argmax) completion per prompt is scored by ``reward.fn`` and the section 1
shaping (no KL); its reward ``b_g`` is the baseline of the prompt's ``G`` rows:
``A[i,t] = m[i,t] (sum_{u>=t} m r[i,u] - b_g)``, ``r`` the token rewards (``R_i`` on the last
valid token, plus KL-in-reward if on). No normalisation. ``G >= 1`` is allowed (ReMax uses 1).
"""
import numbers

import chex
import jax.numpy as jnp

from rljax.algos.advantages import discounted_returns
from rljax.algos.losses import Metrics
from rljax.algos.registry import register_advantage


def _row_metric(rows_ok, values):
  count = rows_ok.sum().astype(jnp.result_type(float))
  return jnp.where(rows_ok, values, 0).sum().astype(count.dtype), count


def _check_rows(mask, group_size, baseline):
  if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 1:
    raise ValueError(f"algo.advantage='remax' needs rollout.group_size >= 1, got {group_size!r}")
  batch = mask.shape[0]
  if baseline.shape[0] * group_size != batch:
    raise ValueError(f"remax baseline has {baseline.shape[0]} prompts; with "
                     f"rollout.group_size={group_size} the batch has {batch} rows")


@register_advantage("remax", min_group_size=1)
def remax_advantages(token_rewards: chex.Array, mask: chex.Array, group_size: int,
                     remax_baseline: chex.Array) -> chex.Array:
  """ReMax (Li et al., arXiv 2310.10505) advantages ``[B, T]`` (0 on padding):
  ``A[i,t] = m[i,t] (sum_{u>=t} m r[i,u] - b_g)``, no normalisation, ``G >= 1``.

  ``token_rewards[B, T]``: per-token rewards (``outcome_token_rewards`` or ``kl_reward_tokens``);
  ``remax_baseline[P]``: the greedy completion's reward per prompt, repeated over its ``G``
  contiguous rows. For outcome-only rewards ``A = (R_i - b_g) m``.
  """
  chex.assert_rank([token_rewards, mask, remax_baseline], [2, 2, 1])
  chex.assert_equal_shape([token_rewards, mask])
  _check_rows(mask, group_size, remax_baseline)
  returns = discounted_returns(token_rewards, mask, 1.0)
  row_baseline = jnp.repeat(remax_baseline.astype(returns.dtype), group_size)
  return jnp.where(mask > 0, returns - row_baseline[:, None], jnp.zeros((), returns.dtype))


def remax_metrics(rewards: chex.Array, advantages: chex.Array, mask: chex.Array,
                  group_size: int, remax_baseline: chex.Array) -> Metrics:
  """``remax/`` metrics as ``(sum, count)``: ``baseline_mean`` (over prompts with a valid token),
  ``adv_mean`` (token-mean ``A``), ``beat_frac`` (share of non-empty rows with ``R_i > b_g``)."""
  chex.assert_rank([rewards, advantages, mask, remax_baseline], [1, 2, 2, 1])
  chex.assert_equal_shape_prefix([rewards, mask], 1)
  _check_rows(mask, group_size, remax_baseline)
  valid = mask > 0
  rows_ok = valid.any(axis=1)
  prompts_ok = rows_ok.reshape(-1, group_size).any(axis=1)
  row_baseline = jnp.repeat(remax_baseline, group_size)
  n_tokens = valid.sum().astype(jnp.result_type(float))
  return {
      "remax/baseline_mean": _row_metric(prompts_ok, remax_baseline),
      "remax/adv_mean": (jnp.where(valid, advantages, 0).sum().astype(n_tokens.dtype), n_tokens),
      "remax/beat_frac": _row_metric(rows_ok, (rewards > row_baseline).astype(n_tokens.dtype)),
  }

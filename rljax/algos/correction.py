"""Rollout correction: truncated IS weights and rejection, sampler -> old (docs/algorithms.md).

The sampler and the trainer give the same tokens different probabilities. rljax recomputes
``old_logp`` (verl's "decoupled" mode), so the correction runs ``sampler -> old`` and the PPO ratio
covers ``old -> theta``. With ``d = (old_logp - sampler_logp) m`` the ratio ``rho`` is, by level:

* ``token``:     ``rho[i,t] = exp(clip(d[i,t], -20, 20))``;
* ``sequence``:  ``rho_i = exp(clip(sum_t d, -20, 20))`` (the sum is clamped, not each token);
* ``geometric``: ``rho_i = exp(clip(sum_t d / max(|o_i|, 1), -20, 20))``.

Row ratios are broadcast to the row's tokens; an empty row has ratio 1. Everything here is
computed once per rollout batch (``old_logp`` is fixed during the update), so the metrics are
scalars of the whole batch, not ``(sum, count)`` pairs. Sources: verl ``rollout_corr_helper.py``
(weights, rejection, metrics), TRL ``grpo_trainer.py`` (vLLM IS block); Yao et al. 2025 (TIS);
Liu, Li et al. 2025 (MIS, Geo-RS).
"""
from typing import Dict, Optional, Tuple

import chex
import jax
import jax.numpy as jnp

from rljax.algos.checks import check_range, is_static_number
from rljax.config.table import options

LOG_RATIO_CLAMP = 20.0
BATCH_NORM_MIN = 1e-8  # batch normalisation is skipped when the mean weight is at most this
ROLLOUT_LEVELS = tuple(o for o in options("algo.rollout_is") if o != "none")
OVER_CAP = options("algo.rollout_is_over_cap")

Scalars = Dict[str, chex.Array]


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))


def _check_level(level: str, key: str) -> None:
  if level not in ROLLOUT_LEVELS:
    raise ValueError(f"{key} must be one of {ROLLOUT_LEVELS} (or 'none' to switch it off), "
                     f"got {level!r}")


def _mean(total, count):
  return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.zeros_like(total))


def rollout_log_ratios(old_logp: chex.Array, sampler_logp: chex.Array, mask: chex.Array, *,
                       level: str, key: str = "algo.rollout_is") -> chex.Array:
  """Clamped ``log rho`` of ``level`` ``[B, T]`` (row levels broadcast; padding holds the row's
  value, 0 for token level). ``key`` names the config key in the error for a bad level."""
  _check_tokens(old_logp, sampler_logp, mask)
  _check_level(level, key)
  valid = mask > 0
  d = jnp.where(valid, old_logp - sampler_logp, 0)
  if level == "token":
    x = d
  else:
    x = d.sum(axis=1, keepdims=True)
    if level == "geometric":
      x = x / jnp.maximum(valid.sum(axis=1, keepdims=True), 1).astype(x.dtype)
  return jnp.broadcast_to(jnp.clip(x, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask.shape)


def rollout_ratios(old_logp: chex.Array, sampler_logp: chex.Array, mask: chex.Array, *,
                   level: str, key: str = "algo.rollout_is") -> chex.Array:
  """``rho`` of ``level`` ``[B, T]``: ``exp`` of ``rollout_log_ratios``."""
  return jnp.exp(rollout_log_ratios(old_logp, sampler_logp, mask, level=level, key=key))


def _unit_stats(values, mask, level):
  """``(values per unit, unit is valid)``: per token for ``token``; for row levels the row-mean
  over valid tokens (the row's value, as rows are constant), per non-empty row."""
  valid = mask > 0
  if level == "token":
    return values, valid
  lengths = jnp.maximum(valid.sum(axis=1), 1).astype(values.dtype)
  return jnp.where(valid, values, 0).sum(axis=1) / lengths, valid.any(axis=1)


def rollout_is_weights(old_logp: chex.Array, sampler_logp: chex.Array, mask: chex.Array, *,
                       level: str, cap: float, floor: Optional[float] = None,
                       batch_norm: bool = False, over_cap: str = "truncate"
                       ) -> Tuple[chex.Array, Scalars]:
  """Rollout IS weights ``[B, T]``, by what happens to a ratio above the cap (``over_cap``,
  ``algo.rollout_is_over_cap``):

  * ``truncate`` (truncated IS, TIS: Yao et al. 2025; verl's rollout correction):
    ``w = sg(m max(min(rho, cap), floor))``. A token above the cap keeps weight ``cap``.
  * ``mask`` (AReaL's decoupled PPO objective, Fu et al. 2025, arXiv 2505.24298,
    ``behav_imp_weight_cap``): ``w = sg(m [rho <= cap] max(rho, floor))``. A token above the cap
    gets weight 0, so it leaves the loss's numerator, while ``m`` is unchanged, so it still
    counts in the aggregation's denominator (AReaL divides by all loss-mask tokens). This is
    not rejection (``rollout_rs``), which takes the token out of the denominator as well.

  ``floor=None``: no lower bound (verl truncates from above only; TRL ``clip_min``). With
  ``batch_norm`` (``algo.rollout_is_batch_norm``) ``w <- w / mean(w)``, the mean being the
  token-mean (``token``) or the row-mean of the per-row weight (row levels) over the whole batch,
  skipped when ``<= 1e-8``. The weights multiply the policy term only (``l <- w l``), not KL or
  entropy. With ``level='token'`` this is ``algo.tis_cap`` (times the mask).

  Metrics (``rollout_is/``, ``rho`` before truncation, over valid tokens for ``token`` and
  non-empty rows otherwise): ``mean``, ``min``, ``max``; ``frac_high`` (``rho > cap``),
  ``frac_low`` (``rho < 1/cap``); ``ess = 1/token-mean((w'/token-mean w')^2)`` with
  ``w' = clip(rho, 1/cap, cap)``; ``batch_norm_factor`` (the divisor, 1 when not applied).
  With ``over_cap='mask'``, ``frac_high`` is the share of units whose weight is 0.
  """
  check_range("algo.rollout_is_cap", cap, lo=0, lo_open=True)
  if over_cap not in OVER_CAP:
    raise ValueError(f"algo.rollout_is_over_cap must be one of {OVER_CAP}, got {over_cap!r}")
  if floor is not None:
    check_range("algo.rollout_is_floor", floor, lo=0,
                hi=cap if is_static_number(cap) else None)
  rho = rollout_ratios(old_logp, sampler_logp, mask, level=level, key="algo.rollout_is")
  valid = mask > 0
  w = jnp.minimum(rho, cap) if over_cap == "truncate" else rho
  if floor is not None:
    w = jnp.maximum(w, floor)
  keep = valid if over_cap == "truncate" else valid & (rho <= cap)
  w = jnp.where(keep, w, 0)
  factor = jnp.ones((), w.dtype)
  if batch_norm:
    unit_w, unit_ok = _unit_stats(w, mask, level)
    mu = _mean(jnp.where(unit_ok, unit_w, 0).sum(), unit_ok.sum())
    factor = jnp.where(mu > BATCH_NORM_MIN, mu, 1.0).astype(w.dtype)
    w = w / factor
  w = jax.lax.stop_gradient(w)

  unit_rho, unit_ok = _unit_stats(rho, mask, level)
  n_units = unit_ok.sum()
  n_tokens = valid.sum()
  clipped = jnp.where(valid, jnp.clip(rho, 1.0 / cap, cap), 0)
  normed = clipped / jnp.where(n_tokens > 0, _mean(clipped.sum(), n_tokens), 1.0)
  second_moment = _mean((normed ** 2).sum(), n_tokens)
  metrics = {
      "rollout_is/mean": _mean(jnp.where(unit_ok, unit_rho, 0).sum(), n_units),
      "rollout_is/min": jnp.where(n_units > 0, jnp.where(unit_ok, unit_rho, jnp.inf).min(), 0),
      "rollout_is/max": jnp.where(n_units > 0, jnp.where(unit_ok, unit_rho, -jnp.inf).max(), 0),
      "rollout_is/frac_high": _mean((unit_ok & (unit_rho > cap)).sum().astype(w.dtype), n_units),
      "rollout_is/frac_low": _mean((unit_ok & (unit_rho < 1.0 / cap)).sum().astype(w.dtype),
                                   n_units),
      "rollout_is/ess": jnp.where(second_moment > 0, 1.0 / jnp.where(second_moment > 0,
                                                                    second_moment, 1), 0),
      "rollout_is/batch_norm_factor": factor,
  }
  return w, metrics


def rollout_rejection_mask(old_logp: chex.Array, sampler_logp: chex.Array, mask: chex.Array, *,
                           level: Optional[str] = None, lo: Optional[float] = 0.0,
                           hi: Optional[float] = None, veto: Optional[float] = None,
                           k3: Optional[float] = None) -> Tuple[chex.Array, Scalars]:
  """Rollout rejection: the new mask ``[B, T]`` (same dtype as ``mask``) and its metrics.

  ``level`` (``algo.rollout_rs``; None = no ratio test) rejects the token (``token``) or the row
  (row levels) wherever ``rho`` is outside ``[lo, hi]`` (inclusive; both required with a level).
  Extra row criteria, each must pass: ``veto`` rejects a row if any valid token has
  ``rho_t < veto``; ``k3`` rejects a row if ``row-mean_t(rho_t - 1 - log rho_t) > k3`` (token
  ``rho_t``, clamped). Rejected entries get ``m = 0`` and so leave every count. Apply after
  advantages (group statistics include rows rejected later, as verl).

  Metrics: ``rollout_rs/token_frac`` (share of valid tokens rejected), ``rollout_rs/seq_frac``
  (share of non-empty rows with a rejected token).
  """
  _check_tokens(old_logp, sampler_logp, mask)
  valid = mask > 0
  keep = jnp.ones(mask.shape, bool)
  if level is not None:
    if lo is None or hi is None:
      raise ValueError(f"algo.rollout_rs={level!r} needs both algo.rollout_rs_lo and "
                       f"algo.rollout_rs_hi, got lo={lo!r}, hi={hi!r}")
    check_range("algo.rollout_rs_lo", lo, lo=0, hi=hi if is_static_number(hi) else None)
    rho = rollout_ratios(old_logp, sampler_logp, mask, level=level, key="algo.rollout_rs")
    keep &= (rho >= lo) & (rho <= hi)
  token_log_ratio = jnp.clip(old_logp - sampler_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  if veto is not None:
    check_range("algo.rollout_rs_veto", veto, lo=0, lo_open=True)
    vetoed = (valid & (token_log_ratio < jnp.log(veto))).any(axis=1, keepdims=True)
    keep &= ~vetoed
  if k3 is not None:
    k3_tokens = jnp.exp(token_log_ratio) - 1.0 - token_log_ratio
    lengths = jnp.maximum(valid.sum(axis=1, keepdims=True), 1).astype(k3_tokens.dtype)
    keep &= jnp.where(valid, k3_tokens, 0).sum(axis=1, keepdims=True) / lengths <= k3
  new_mask = jnp.where(keep, mask, jnp.zeros((), mask.dtype))
  rejected = valid & ~keep
  rows = valid.any(axis=1)
  count_dtype = jnp.result_type(float)
  metrics = {
      "rollout_rs/token_frac": _mean(rejected.sum().astype(count_dtype), valid.sum()),
      "rollout_rs/seq_frac": _mean((rows & rejected.any(axis=1)).sum().astype(count_dtype),
                                   rows.sum()),
  }
  return new_mask, metrics


def mismatch_metrics(old_logp: chex.Array, sampler_logp: chex.Array,
                     mask: chex.Array) -> Scalars:
  """Sampler/trainer mismatch of a rollout batch (``mismatch/``; before any rejection).

  Over valid tokens ("token-mean") and non-empty rows ("row-mean"), ``rho`` the token ratio:
  ``k1 = token-mean(sampler_logp - old_logp)`` (estimates ``KL(sampler || old)``, verl ``kl``);
  ``k3 = token-mean(rho - 1 - log rho)``; ``abs_diff_mean`` / ``abs_diff_max`` of
  ``|old_logp - sampler_logp|`` (TRL); ``train_ppl = row-mean exp(-row-mean old_logp)``,
  ``sampler_ppl`` likewise; ``log_ppl_diff = row-mean(row-mean sampler_logp - row-mean old_logp)``
  and ``ppl_ratio`` the row-mean of its ``exp``; ``chi2_token = token-mean(rho^2) - 1``;
  ``chi2_seq = row-mean exp(2 clip(sum_t d, -20, 20)) - 1``.
  """
  _check_tokens(old_logp, sampler_logp, mask)
  valid = mask > 0
  n = valid.sum()
  rows = valid.any(axis=1)
  n_rows = rows.sum()
  lengths = jnp.maximum(valid.sum(axis=1), 1).astype(old_logp.dtype)

  def token_mean(x):
    return _mean(jnp.where(valid, x, 0).sum(), n)

  def row_mean(x):
    return _mean(jnp.where(rows, x, 0).sum(), n_rows)

  def per_row_mean(x):
    return jnp.where(valid, x, 0).sum(axis=1) / lengths

  diff = old_logp - sampler_logp
  log_rho = jnp.clip(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  seq_log_rho = jnp.clip(jnp.where(valid, diff, 0).sum(axis=1), -LOG_RATIO_CLAMP,
                         LOG_RATIO_CLAMP)
  log_ppl_diff = per_row_mean(sampler_logp) - per_row_mean(old_logp)
  abs_diff = jnp.abs(diff)
  return {
      "mismatch/k1": token_mean(-diff),
      "mismatch/k3": token_mean(jnp.exp(log_rho) - 1.0 - log_rho),
      "mismatch/abs_diff_mean": token_mean(abs_diff),
      "mismatch/abs_diff_max": jnp.where(n > 0, jnp.where(valid, abs_diff, 0).max(), 0),
      "mismatch/train_ppl": row_mean(jnp.exp(-per_row_mean(old_logp))),
      "mismatch/sampler_ppl": row_mean(jnp.exp(-per_row_mean(sampler_logp))),
      "mismatch/log_ppl_diff": row_mean(log_ppl_diff),
      "mismatch/ppl_ratio": row_mean(jnp.exp(log_ppl_diff)),
      "mismatch/chi2_token": token_mean(jnp.exp(2.0 * log_rho)) - jnp.where(n > 0, 1.0, 0.0),
      "mismatch/chi2_seq": row_mean(jnp.exp(2.0 * seq_log_rho)) - jnp.where(n_rows > 0, 1.0, 0.0),
  }

"""Entropy transforms: the 80/20 high-entropy token mask (docs/algorithms.md) and the adaptive
entropy coefficient of Skywork-OR1 (8.7).

* 80/20 (Wang et al., arXiv 2506.01939; TRL ``get_high_entropy_mask``): only the top-``rho``
  highest-entropy "forking" tokens of the pool receive the policy gradient. One threshold per pool
  (the optimizer minibatch with ``algo.entropy_mask_source='old'``, from ``H_old``), computed once
  and passed to the loss as a mask: ``l <- keep l`` with ``m`` unchanged.
* Adaptive coefficient (He et al., arXiv 2505.22312; Skywork-OR1 ``EntController``): the section 5
  entropy bonus is on, with a rising coefficient, only while the measured entropy is below a target.
"""
from typing import NamedTuple, Tuple

import chex
import jax.numpy as jnp

from rljax.algos.checks import check_range, is_static_number
from rljax.algos.losses import Metrics, token_metrics


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))


# --- 80/20: high-entropy minority tokens ----------------------------------------------------------

def masked_quantile(values: chex.Array, mask: chex.Array, q: float) -> chex.Array:
  """Quantile ``q`` of the valid entries of ``values``, linear interpolation (numpy/torch default).

  Sort the ``n`` valid values ``x``, ``p = q (n - 1)``, ``tau = x[floor p] + (p - floor p)
  (x[ceil p] - x[floor p])``; the interpolation is evaluated as numpy's ``_lerp`` does (from the
  nearer end), so ties between the two neighbours return that value exactly. 0 when ``n = 0``.
  """
  chex.assert_equal_shape([values, mask])
  check_range("quantile", q, lo=0, hi=1)
  valid = (mask > 0).reshape(-1)
  x = jnp.sort(jnp.where(valid, values.reshape(-1), jnp.inf))
  n = valid.sum()
  p = q * jnp.maximum(n - 1, 0).astype(values.dtype)
  lo = jnp.floor(p).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
  t = p - lo.astype(values.dtype)
  a, b = x[lo], x[hi]
  diff = b - a
  tau = jnp.where(t >= 0.5, b - diff * (1.0 - t), a + diff * t)
  return jnp.where(n > 0, tau, jnp.zeros((), values.dtype))


def entropy_keep_mask(entropy: chex.Array, mask: chex.Array, *,
                      rho: float) -> Tuple[chex.Array, Metrics]:
  """80/20 keep mask ``[B, T]`` (bool) of one pool: ``m & (H >= quantile(pool H, 1 - rho))``.

  Tokens tied at the threshold are kept, so more than a fraction ``rho`` can be kept. ``rho = 0``
  keeps only the tokens equal to the maximum; ``rho >= 1`` switches the mask off (keeps every valid
  token); an empty pool keeps nothing. ``entropy`` is ``H_old`` (``entropy_mask_source='old'``)
  or the loss forward's ``H`` (``'current'``); ``mask`` is the pool after the overlong filter and
  rollout rejection. Use ``l <- keep l`` for the policy loss (``m`` unchanged, so ``token_mean``
  still divides by all valid tokens), ``m keep`` for the entropy bonus and the entropy
  controller's measure; KL is not masked.

  Metrics (``(sum, count)``, ``entropy_mask/``): ``tau``, ``kept_frac = sum(keep)/sum(m)``,
  ``H_kept_mean``, ``H_mean``.
  """
  _check_tokens(entropy, mask)
  check_range("algo.entropy_top_rho", rho, lo=0)
  valid = mask > 0
  # Written without a Python branch on rho: it may be a traced hyperparameter.
  off = jnp.asarray(rho) >= 1.0
  tau = masked_quantile(entropy, mask, jnp.clip(1.0 - jnp.asarray(rho, entropy.dtype), 0.0, 1.0))
  pool_min = jnp.where(valid.any(), jnp.where(valid, entropy, jnp.inf).min(),
                       jnp.zeros((), entropy.dtype))
  tau = jnp.where(off, pool_min, tau)  # rho >= 1: every valid token is kept
  keep = valid & (off | (entropy >= tau))
  dt = entropy.dtype
  one = jnp.ones((), jnp.result_type(float))
  metrics = {"entropy_mask/tau": (tau.astype(one.dtype), one)}
  metrics.update(token_metrics(mask, **{"entropy_mask/kept_frac": keep.astype(dt),
                                        "entropy_mask/H_mean": entropy}))
  metrics.update(token_metrics(keep, **{"entropy_mask/H_kept_mean": entropy}))
  return keep, metrics


# --- adaptive entropy coefficient (Skywork-OR1) ---------------------------------------------------

class EntropyCtrlState(NamedTuple):
  """Carried across RL steps and checkpointed (restored on resume, as TRL does).

  ``coef``: the controller's ``c``; ``applied``: ``alpha``, the bonus coefficient the next step
  uses; ``measured``: the last measured entropy (NaN before the first measurement).
  """
  coef: chex.Array
  applied: chex.Array
  measured: chex.Array


def entropy_ctrl_init(initial_coef: float) -> EntropyCtrlState:
  """``c = alpha_0 = c_0 = algo.entropy_coef`` (Skywork: the first step uses ``c_0``; TRL's
  first is 0)."""
  c = jnp.asarray(initial_coef, jnp.result_type(float))
  return EntropyCtrlState(coef=c, applied=c, measured=jnp.full((), jnp.nan, c.dtype))


def entropy_ctrl_step(state: EntropyCtrlState, measured: chex.Numeric, *, target: float,
                      delta: float, coef_min: float, coef_max: float,
                      strict: bool = True) -> EntropyCtrlState:
  """One controller update after a step with measured entropy ``e``.

  ``low = e < target`` (Skywork; ``strict=False`` gives TRL's ``<=``);
  ``c <- clip(c + delta if low else c - delta, c_min, c_max)``; ``alpha = c low``.
  Pure: works on Python floats and on (traced) arrays.
  """
  check_range("algo.entropy_coef_delta", delta, lo=0)
  if is_static_number(coef_min) and is_static_number(coef_max) and not coef_min <= coef_max:
    raise ValueError(f"algo.entropy_coef_min <= algo.entropy_coef_max required, got "
                     f"{coef_min!r} > {coef_max!r}")
  measured = jnp.asarray(measured, state.coef.dtype)
  low = measured < target if strict else measured <= target
  coef = jnp.clip(jnp.where(low, state.coef + delta, state.coef - delta), coef_min, coef_max)
  return EntropyCtrlState(coef=coef, applied=coef * low.astype(coef.dtype), measured=measured)


def sampled_entropy(old_logp: chex.Array, mask: chex.Array) -> Tuple[chex.Array, chex.Array]:
  """Skywork's measure (``algo.entropy_ctrl_estimate='sampled'``): ``-token-mean(old_logp)`` over
  the rollout batch, as ``(sum, count)``. A sampled-token estimate, not the full-vocabulary
  entropy (``'full'`` is the token-mean of ``H`` of the step's forwards, e.g. ``token_metrics``)."""
  _check_tokens(old_logp, mask)
  return token_metrics(mask, e=-old_logp)["e"]

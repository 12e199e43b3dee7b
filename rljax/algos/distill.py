"""On-policy distillation advantage (docs/algorithms.md).

The student samples its own completions and a teacher scores every sampled token; the per-token
reward is minus a single-sample estimate of the reverse KL (Thinking Machines, "On-Policy
Distillation", 2025, ``tinker-cookbook`` ``incorporate_kl_penalty``; MiniLLM, arXiv 2306.08543,
TRL ``minillm_trainer._compute_advantage``):

``rkl[i,t] = m (lp_s - teacher_logp)`` (detached), ``A_opd[i,t] = sum_{u>=t} gamma^(u-t)
(-coef rkl[i,u])`` (just ``-coef rkl`` for ``gamma = 0``), optionally divided by
``sum_{u>=t} gamma^(u-t) m[i,u]`` (``length_norm``, as TRL MiniLLM), then
``A = A_env + A_opd`` with ``A_env`` the estimator's advantages after their own normalisation.
"""
from typing import Tuple

import chex
import jax
import jax.numpy as jnp

from rljax.algos.checks import check_range, is_static_number
from rljax.algos.losses import Metrics, token_metrics

LENGTH_NORM_MIN = 1e-12  # the normaliser is >= 1 on valid tokens; this only guards padding


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))


def discounted_future_sum(x: chex.Array, gamma: float) -> chex.Array:
  """``y[i,t] = sum_{u>=t} gamma^(u-t) x[i,u]`` over absolute positions ``[B, T]`` (tinker's
  ``discounted_future_sum_vectorized``); padding inside the sum counts as a step."""
  chex.assert_rank(x, 2)

  def step(acc, column):
    acc = column + gamma * acc
    return acc, acc

  _, out = jax.lax.scan(step, jnp.zeros(x.shape[:1], x.dtype), x.T, reverse=True)
  return out.T


def opd_advantages(student_logp: chex.Array, teacher_logp: chex.Array, mask: chex.Array, *,
                   coef: float, discount: float = 0.0,
                   length_norm: bool = False) -> Tuple[chex.Array, Metrics]:
  """``A_opd[B, T]`` (0 on padding, no gradient) and metrics.

  ``student_logp``: ``old_logp`` (``algo.opd_student_logp='old'``) or ``sampler_logp``
  (``'sampler'``, Tinker). ``coef = algo.opd_coef``, ``discount = algo.opd_discount``,
  ``length_norm = algo.opd_length_norm``. Padded entries of ``teacher_logp`` are never read (they
  may be ``-inf``). Metrics (``(sum, count)``): ``opd/reverse_kl`` (token-mean ``rkl``, Tinker's
  ``teacher_kl``), ``opd/adv_mean`` (token-mean ``A_opd``), ``opd/teacher_nonfinite`` (the
  fraction of valid tokens whose teacher log-prob is NaN or infinite; the trainer stops on any).
  """
  _check_tokens(student_logp, teacher_logp, mask)
  check_range("algo.opd_discount", discount, lo=0, hi=1)
  valid = mask > 0
  rkl = jax.lax.stop_gradient(jnp.where(valid, student_logp - teacher_logp, 0))
  adv = -coef * rkl
  # A traced discount takes the scan, which is exact at 0 too (acc = a + 0 * acc).
  if not (is_static_number(discount) and discount == 0):
    adv = discounted_future_sum(adv, discount)
    if length_norm:
      norm = discounted_future_sum(valid.astype(adv.dtype), discount)
      adv = adv / jnp.maximum(norm, LENGTH_NORM_MIN)
  adv = jnp.where(valid, adv, jnp.zeros((), adv.dtype))
  nonfinite = (~jnp.isfinite(teacher_logp)).astype(adv.dtype)
  return adv, token_metrics(mask, **{"opd/reverse_kl": rkl, "opd/adv_mean": adv,
                                     "opd/teacher_nonfinite": nonfinite})


def add_opd_advantages(env_advantages: chex.Array, student_logp: chex.Array,
                       teacher_logp: chex.Array, mask: chex.Array, *, coef: float,
                       discount: float = 0.0,
                       length_norm: bool = False) -> Tuple[chex.Array, Metrics]:
  """``A = A_env + A_opd`` ``[B, T]`` (not whitened afterwards) and the metrics of
  ``opd_advantages`` plus ``opd/env_adv_abs_mean`` (token-mean ``|A_env|``). ``mask`` is the loss
  mask (after the overlong filter and rollout rejection), so those tokens get 0. Pure
  distillation: ``A_env = 0``. ``coef = 0`` returns ``A_env`` unchanged (on valid tokens)."""
  _check_tokens(env_advantages, mask)
  adv, metrics = opd_advantages(student_logp, teacher_logp, mask, coef=coef, discount=discount,
                                length_norm=length_norm)
  metrics.update(token_metrics(mask, **{"opd/env_adv_abs_mean": jnp.abs(env_advantages)}))
  total = jnp.where(mask > 0, env_advantages + adv.astype(env_advantages.dtype),
                    jnp.zeros((), env_advantages.dtype))
  return total, metrics

"""Clip-Cov and KL-Cov (docs/algorithms.md; Cui et al., arXiv 2505.22617).

Under policy gradient the entropy change tracks minus the covariance of a token's log-prob and its
advantage; a few very-high-covariance tokens drive entropy collapse. Clip-Cov zeroes the loss of a
small random subset of them, KL-Cov adds a ``|delta|`` penalty on the top-k.

The selection (``sel``) couples tokens, so it is computed once per optimizer minibatch over all its
valid tokens, from inputs known before the first forward (``old_logp``, ``A``, uniforms ``u``),
and enters the loss as a 0/1 array (section 8.0): sum the loss over micro-batches and the result
does not depend on the split. Token covariance over the selection unit (``N`` valid tokens):
``c[i,t] = (A[i,t] - token-mean A) (lp[i,t] - token-mean lp)``, ``lp = old_logp`` (verl uses
``sg(logp)`` of the micro-batch; equal at ``r = 1``).
"""
from typing import Tuple

import chex
import jax
import jax.numpy as jnp

from rljax.algos.checks import check_range, is_static_number
from rljax.algos.losses import Metrics, log_ratio, ppo_clip_loss, token_metrics
from rljax.algos.registry import register_policy_loss


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))


def _check_ratio(ratio, key: str) -> None:
  # A fraction of the minibatch's valid tokens; above 1 the top-k would reach padding.
  check_range(key, ratio, lo=0, lo_open=True, hi=1)


def _count_dtype():
  return jnp.result_type(float)


def selection_uniforms(seed: int, step: chex.Numeric, minibatch_index: chex.Numeric,
                       shape: Tuple[int, int]) -> chex.Array:
  """``u[i,t] ~ U(0, 1)`` from ``fold_in(fold_in(PRNGKey(seed), step), minibatch_index)``.

  The same seed, step and minibatch give the same draws (and so the same Clip-Cov ``sel``) on a
  rerun or a resume, on any number of devices.
  """
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), step), minibatch_index)
  return jax.random.uniform(key, shape, _count_dtype())


def token_covariance(advantages: chex.Array, lp: chex.Array, mask: chex.Array) -> chex.Array:
  """``c = (A - token-mean A) (lp - token-mean lp)`` ``[B, T]`` over valid tokens; 0 on padding."""
  _check_tokens(advantages, lp, mask)
  valid = mask > 0
  n = jnp.maximum(valid.sum(), 1).astype(lp.dtype)
  a_mean = jnp.where(valid, advantages, 0).sum() / n
  lp_mean = jnp.where(valid, lp, 0).sum() / n
  return jnp.where(valid, (advantages - a_mean) * (lp - lp_mean), 0)


def _floor_fraction(ratio: float, count: chex.Array) -> chex.Array:
  # floor(ratio * N) of a Python float and an integer count, in the widest float available.
  return jnp.floor(ratio * count.astype(_count_dtype())).astype(jnp.int32)


def _flat_ranks(keys: chex.Array) -> chex.Array:
  """Rank of each entry in ascending order of ``keys`` ``[B, T]``, ties to the lower flat index."""
  order = jnp.argsort(keys.reshape(-1), stable=True)
  ranks = jnp.zeros(order.shape, jnp.int32).at[order].set(jnp.arange(order.size, dtype=jnp.int32))
  return ranks.reshape(keys.shape)


def clip_cov_select(old_logp: chex.Array, advantages: chex.Array, mask: chex.Array,
                    uniforms: chex.Array, *, ratio: float = 2e-4, lb: float = 1.0,
                    ub: float = 5.0) -> Tuple[chex.Array, Metrics]:
  """Clip-Cov's selected tokens ``sel[B, T]`` (bool) of one minibatch, and metrics.

  Candidates: valid tokens with ``lb < c < ub`` (strict). ``n = min(max(floor(ratio N), 1),
  #candidates)``; the ``n`` candidates with the smallest ``u`` are selected (a uniform draw without
  replacement; equal ``u`` go to the lower flat index). verl also excludes tokens already clipped
  by PPO; that needs the current ratio, and excludes nothing at ``r = 1``, so it is not done here.

  Metrics (``(sum, count)``): ``cov/mean`` (token-mean of ``c``), ``clip_cov/frac = n/N``,
  ``clip_cov/candidates`` (share of valid tokens that are candidates).
  """
  _check_tokens(old_logp, advantages, mask, uniforms)
  _check_ratio(ratio, "algo.clip_cov_ratio")
  if is_static_number(lb) and is_static_number(ub) and not lb < ub:
    raise ValueError(f"algo.clip_cov_lb < algo.clip_cov_ub required, got lb={lb!r}, ub={ub!r}")
  valid = mask > 0
  c = token_covariance(advantages, old_logp, mask)
  candidate = valid & (c > lb) & (c < ub)
  n_valid = valid.sum()
  n_cand = candidate.sum()
  n = jnp.minimum(jnp.maximum(_floor_fraction(ratio, n_valid), 1), n_cand)
  ranks = _flat_ranks(jnp.where(candidate, uniforms, jnp.inf))
  sel = candidate & (ranks < n)
  count = n_valid.astype(_count_dtype())
  metrics = token_metrics(mask, **{"cov/mean": c})
  metrics["clip_cov/frac"] = (n.astype(_count_dtype()), count)
  metrics["clip_cov/candidates"] = (n_cand.astype(_count_dtype()), count)
  return sel, metrics


@register_policy_loss("clip_cov", hparams={"eps_low": "clip_eps_low", "eps_high": "clip_eps_high"})
def clip_cov_loss(logp, old_logp, advantages, mask, cov_sel, *, eps_low: float = 1.0,
                  eps_high: float = 1.0) -> Tuple[chex.Array, Metrics]:
  """Clip-Cov (Cui et al., arXiv 2505.22617) per-token loss ``[B, T]``: the PPO loss with a small
  random subset of high-covariance tokens zeroed.

  ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) (1 - sel)``, with ``sel = cov_sel`` from
  ``clip_cov_select`` over the whole minibatch; selected tokens are zeroed, not rejected (they
  stay in every count). No dual clip (verl's ``clip_cov`` ignores it). Metrics: section 3's
  ``clip_frac_low``/``clip_frac_high``, ``ratio_mean``, ``approx_kl``.
  """
  _check_tokens(logp, old_logp, advantages, mask, cov_sel)
  delta = log_ratio(logp, old_logp)
  ratio = jnp.exp(delta)
  loss, low, high, _ = ppo_clip_loss(ratio, advantages, eps_low=eps_low, eps_high=eps_high)
  loss = jnp.where(cov_sel > 0, jnp.zeros((), loss.dtype), loss)
  dt = ratio.dtype
  return loss, token_metrics(mask, clip_frac_low=low.astype(dt), clip_frac_high=high.astype(dt),
                             ratio_mean=ratio, approx_kl=-delta)


def kl_cov_select(old_logp: chex.Array, advantages: chex.Array, mask: chex.Array, *,
                  ratio: float = 2e-3) -> Tuple[chex.Array, Metrics]:
  """KL-Cov's selected tokens ``sel[B, T]`` (bool) of one minibatch, and metrics.

  The ``k = max(1, floor(ratio N))`` valid tokens with the largest ``c``; ties go to the lower flat
  index ``i*T + t`` (``torch.topk`` leaves them unspecified); none when ``N = 0``. Metrics:
  ``cov/mean``, ``kl_cov/frac = k/N``.
  """
  _check_tokens(old_logp, advantages, mask)
  _check_ratio(ratio, "algo.kl_cov_ratio")
  valid = mask > 0
  c = token_covariance(advantages, old_logp, mask)
  n_valid = valid.sum()
  k = jnp.where(n_valid > 0, jnp.maximum(_floor_fraction(ratio, n_valid), 1), 0)
  ranks = _flat_ranks(jnp.where(valid, -c, jnp.inf))
  sel = valid & (ranks < k)
  metrics = token_metrics(mask, **{"cov/mean": c})
  metrics["kl_cov/frac"] = (k.astype(_count_dtype()), n_valid.astype(_count_dtype()))
  return sel, metrics


@register_policy_loss("kl_cov", hparams={"coef": "kl_cov_coef"})
def kl_cov_loss(logp, old_logp, advantages, mask, cov_sel, *,
                coef: float = 1.0) -> Tuple[chex.Array, Metrics]:
  """KL-Cov (Cui et al., arXiv 2505.22617) per-token loss ``[B, T]``:
  ``l = -A r + coef |delta| sel`` on the top-covariance tokens, no clipping at all.

  ``sel = cov_sel`` from ``kl_cov_select`` over the whole minibatch.
  ``|delta|`` is built as ``delta sg(sign(delta))`` so that its gradient is ``sign(delta)``, 0 at
  ``delta = 0`` as in torch (JAX's ``grad(abs)(0)`` is 1). Metrics: ``ratio_mean``, ``approx_kl``,
  ``clip_frac_low``/``clip_frac_high`` (always 0: nothing is clipped) and ``kl_cov/abs_delta``
  (token-mean ``|delta|`` over all valid tokens, verl's ``ppo_kl``).
  """
  _check_tokens(logp, old_logp, advantages, mask, cov_sel)
  delta = log_ratio(logp, old_logp)
  ratio = jnp.exp(delta)
  abs_delta = delta * jax.lax.stop_gradient(jnp.sign(delta))
  loss = -advantages * ratio + coef * abs_delta * (cov_sel > 0).astype(delta.dtype)
  zero = jnp.zeros(mask.shape, ratio.dtype)
  return loss, token_metrics(mask, clip_frac_low=zero, clip_frac_high=zero, ratio_mean=ratio,
                             approx_kl=-delta, **{"kl_cov/abs_delta": jnp.abs(delta)})


"""Policy objectives (docs/algorithms.md section 3) and loss aggregation (section 4).

Each objective is registered as it is: its positional parameters are the arrays it reads, its
keyword-only ones the hyperparameters (``hparams`` maps them to ``algo.*`` keys).

Shapes: ``[B, T]`` rows x completion tokens; ``mask[B, T]`` is 1 on real completion tokens.
Per-token losses ``l[i, t]`` are minimised. ``delta = logp - old_logp`` is clamped to [-20, 20]
before any ``exp``; ``r = exp(delta)``.

Exact reductions: every loss and metric is a ``(sum, count)`` pair. The trainer sums the ``sum``
parts over micro-batches (split by rows) and devices and divides once by the count of the whole
minibatch (``Algorithm.policy_loss_count``), so the result and its gradient do not depend on the split.
"""
from typing import Dict, Optional, Tuple

import chex
import jax
import jax.numpy as jnp

from rljax.algos.registry import (LOSS_AGGS, register_loss_agg, register_policy_loss,
                                  register_regularizer)

LOG_RATIO_CLAMP = 20.0
# Aggregation of objectives with one loss per sequence (GMPO): mean over valid sequences.
SEQUENCE_MEAN = "sequence_mean"

Metrics = Dict[str, Tuple[chex.Array, chex.Array]]


# --- helpers -------------------------------------------------------------------------------------

def _count_dtype():
  return jnp.result_type(float)  # float64 under jax_enable_x64, float32 otherwise


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))


def log_ratio(logp: chex.Array, old_logp: chex.Array) -> chex.Array:
  """``delta = clip(logp - old_logp, -20, 20)`` ``[B, T]``: keeps ``exp`` finite."""
  return jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _masked_mean_rows(x: chex.Array, mask: chex.Array) -> chex.Array:
  """``sum_t m x / |o_i|`` per row ``[B]`` (0 for rows without a valid token)."""
  valid = mask > 0
  lengths = valid.sum(axis=1)
  return jnp.where(valid, x, 0).sum(axis=1) / jnp.maximum(lengths, 1).astype(x.dtype)


def token_metrics(mask: chex.Array, **per_token: chex.Array) -> Metrics:
  """``{name: (sum over valid tokens, number of valid tokens)}`` for ``[B, T]`` values."""
  valid = mask > 0
  count = valid.sum().astype(_count_dtype())
  return {name: (jnp.where(valid, jax.lax.stop_gradient(v), 0).sum().astype(_count_dtype()), count)
          for name, v in per_token.items()}


def scalar_metric(x) -> Tuple[chex.Array, chex.Array]:
  """A scalar logged as itself: ``(x, 1)``."""
  return (jnp.asarray(x, jnp.float32), jnp.ones((), jnp.float32))


def safe_mean(total: chex.Array, count: chex.Array) -> chex.Array:
  """``total / count``, and 0 when ``count == 0`` (a minibatch with nothing to average)."""
  return jnp.where(count > 0, total / jnp.where(count > 0, count, 1), jnp.zeros_like(total))


def _ratio_metrics(mask, ratio, delta, clip_low, clip_high, **extra) -> Metrics:
  dt = ratio.dtype
  return token_metrics(mask, clip_frac_low=clip_low.astype(dt), clip_frac_high=clip_high.astype(dt),
                       ratio_mean=ratio, approx_kl=-delta, **extra)


# --- policy objectives (pure) --------------------------------------------------------------------

def ppo_clip_loss(ratio: chex.Array, advantages: chex.Array, *, eps_low: float, eps_high: float,
                  dual_clip_c: Optional[float] = None
                  ) -> Tuple[chex.Array, chex.Array, chex.Array, chex.Array]:
  """PPO clipped surrogate (arXiv 1707.06347) on any ratio ``[B, T]``.

  ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; with ``dual_clip_c`` set and
  ``A < 0``: ``min(l, -A c)``. Returns ``(l, clipped_low, clipped_high, dual_clipped)`` where a
  clip indicator is True where that clip is active (the loss is flat in ``r``).
  """
  # A traced value was range-checked when the algorithm was resolved.
  if isinstance(dual_clip_c, (int, float)) and dual_clip_c <= 1.0:
    raise ValueError(f"algo.dual_clip_c must be > 1 (a lower bound on -A r for A < 0), "
                     f"got {dual_clip_c}")
  surrogate = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(surrogate, clipped)
  clip_low = (advantages < 0) & (ratio < 1.0 - eps_low)
  clip_high = (advantages > 0) & (ratio > 1.0 + eps_high)
  if dual_clip_c is None:
    dual = jnp.zeros_like(clip_low)
  else:
    bound = -advantages * dual_clip_c
    dual = (advantages < 0) & (loss > bound)
    loss = jnp.where(advantages < 0, jnp.minimum(loss, bound), loss)
  return loss, clip_low, clip_high, dual


@register_policy_loss("ppo", hparams={"eps_low": "clip_eps_low", "eps_high": "clip_eps_high"})
def ppo_loss(logp, old_logp, advantages, mask, *, eps_low: float, eps_high: float,
             dual_clip_c: Optional[float] = None) -> Tuple[chex.Array, Metrics]:
  """PPO / DAPO clip-higher (arXiv 1707.06347, 2503.14476): per-token loss ``[B, T]``.

  ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``, ``r = exp(clip(logp - old_logp,
  -20, 20))``; DAPO's clip-higher is ``eps_high > eps_low`` (0.28 / 0.2). With ``dual_clip_c = c``
  (dual-clip PPO, typically 3) and ``A < 0``: ``min(l, -A c)``. Metrics: ``clip_frac_low`` /
  ``clip_frac_high`` (separately), ``dual_clip_frac``, ``ratio_mean``, ``approx_kl =
  mean(-delta)``.
  """
  _check_tokens(logp, old_logp, advantages, mask)
  delta = log_ratio(logp, old_logp)
  ratio = jnp.exp(delta)
  loss, low, high, dual = ppo_clip_loss(ratio, advantages, eps_low=eps_low, eps_high=eps_high,
                                        dual_clip_c=dual_clip_c)
  return loss, _ratio_metrics(mask, ratio, delta, low, high,
                              dual_clip_frac=dual.astype(ratio.dtype))


@register_policy_loss("gspo", hparams={"eps_low": "clip_eps_low", "eps_high": "clip_eps_high"},
                      loss_agg="seq_mean_token_mean")
def gspo_loss(logp, old_logp, advantages, mask, *, eps_low: float, eps_high: float,
              dual_clip_c: Optional[float] = None) -> Tuple[chex.Array, Metrics]:
  """GSPO-token (arXiv 2507.18071): per-token loss ``[B, T]``.

  ``s_i = exp(sum_t m delta / |o_i|)``, ``s_it = sg(s_i) exp(logp - sg(logp))`` (value ``s_i``,
  gradient of ``s_i`` w.r.t. that token's ``logp``), then the PPO clip on ``s_it``. With the
  ``seq_mean_token_mean`` aggregation and an advantage constant in the sequence this equals
  sequence-level GSPO, value and gradient.
  """
  _check_tokens(logp, old_logp, advantages, mask)
  delta = log_ratio(logp, old_logp)
  seq_ratio = jnp.exp(_masked_mean_rows(delta, mask))
  token_ratio = (jax.lax.stop_gradient(seq_ratio)[:, None]
                 * jnp.exp(logp - jax.lax.stop_gradient(logp)))
  loss, low, high, dual = ppo_clip_loss(token_ratio, advantages, eps_low=eps_low,
                                        eps_high=eps_high, dual_clip_c=dual_clip_c)
  return loss, _ratio_metrics(mask, token_ratio, delta, low, high,
                              dual_clip_frac=dual.astype(token_ratio.dtype))


@register_policy_loss("cispo", hparams={"eps_high": "cispo_eps_high",
                                        "eps_low": "cispo_eps_low"})
def cispo_loss(logp, old_logp, advantages, mask, *, eps_high: float,
               eps_low: Optional[float] = None) -> Tuple[chex.Array, Metrics]:
  """CISPO (arXiv 2506.13585): ``l = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp`` ``[B, T]``.

  ``eps_low=None`` means no lower bound (as the paper). The weight is clipped, never the token:
  every token keeps a gradient ``-w A``.
  """
  _check_tokens(logp, old_logp, advantages, mask)
  delta = log_ratio(logp, old_logp)
  ratio = jnp.exp(delta)
  upper = 1.0 + eps_high
  weight = jnp.minimum(ratio, upper)
  clip_high = ratio > upper
  if eps_low is None:
    clip_low = jnp.zeros_like(clip_high)
  else:
    weight = jnp.maximum(weight, 1.0 - eps_low)
    clip_low = ratio < 1.0 - eps_low
  loss = -jax.lax.stop_gradient(weight) * advantages * logp
  return loss, _ratio_metrics(mask, ratio, delta, clip_low, clip_high)


@register_policy_loss("gmpo", hparams={"eps": "gmpo_eps"}, loss_agg=SEQUENCE_MEAN)
def gmpo_loss(logp, old_logp, advantages, mask, *, eps: float) -> Tuple[chex.Array, Metrics]:
  """GMPO (arXiv 2507.20673): one loss per sequence ``[B]`` (0 for rows without valid token).

  ``L_i = -A_i exp(mean_t l_t)``, ``l_t = sgn(A_i) min(sgn(A_i) delta_t, sgn(A_i) clip(delta_t,
  -eps, eps))`` (geometric mean of token ratios, clipped in log space). ``A_i`` is the mean of
  the row's advantages over its valid tokens (the outcome advantage for outcome estimators).
  """
  _check_tokens(logp, old_logp, advantages, mask)
  delta = log_ratio(logp, old_logp)
  adv_seq = _masked_mean_rows(advantages, mask)
  sign = jnp.sign(adv_seq)[:, None]
  clipped_delta = jnp.clip(delta, -eps, eps)
  log_terms = sign * jnp.minimum(sign * delta, sign * clipped_delta)
  loss = -adv_seq * jnp.exp(_masked_mean_rows(log_terms, mask))
  loss = jnp.where((mask > 0).any(axis=1), loss, 0)
  clip_low = (sign < 0) & (delta < -eps)
  clip_high = (sign > 0) & (delta > eps)
  return loss, _ratio_metrics(mask, jnp.exp(delta), delta, clip_low, clip_high)


@register_policy_loss("pg")
def pg_loss(logp, old_logp, advantages, mask) -> Tuple[chex.Array, Metrics]:
  """REINFORCE / vanilla policy gradient (RLOO 2402.14740, GPG 2504.02546): ``l = -A logp``.

  No ratio and no clip; ``old_logp`` only feeds the logged ratio and approximate KL.
  """
  _check_tokens(logp, old_logp, advantages, mask)
  delta = log_ratio(logp, old_logp)
  no_clip = jnp.zeros(mask.shape, bool)
  return -advantages * logp, _ratio_metrics(mask, jnp.exp(delta), delta, no_clip, no_clip)


# --- aggregation ---------------------------------------------------------------------------------
# Each mode: ``(values[B, T], mask[B, T], norm_constant) -> (sum, count)``; the count depends on
# the mask only. Rows without a valid token are not counted by sequence means.

def _valid_rows(mask):
  return (mask > 0).any(axis=1)


def _row_sums(values, mask):
  return jnp.where(mask > 0, values, 0).sum(axis=1)


@register_loss_agg("token_mean")
def _token_mean(values, mask, norm_constant):
  """``sum_{i,t} m l / sum_{i,t} m`` (DAPO 2503.14476, VAPO, GPG)."""
  del norm_constant
  return _row_sums(values, mask).sum(), (mask > 0).sum().astype(_count_dtype())


@register_loss_agg("seq_mean_token_mean")
def _seq_mean_token_mean(values, mask, norm_constant):
  """``mean_i (sum_t m l / |o_i|)`` (GRPO 2402.03300, GSPO)."""
  del norm_constant
  return _masked_mean_rows(values, mask).sum(), _valid_rows(mask).sum().astype(_count_dtype())


@register_loss_agg("seq_mean_token_sum")
def _seq_mean_token_sum(values, mask, norm_constant):
  """``mean_i sum_t m l``."""
  del norm_constant
  return _row_sums(values, mask).sum(), _valid_rows(mask).sum().astype(_count_dtype())


@register_loss_agg("seq_mean_token_sum_norm")
def _seq_mean_token_sum_norm(values, mask, norm_constant):
  """``mean_i sum_t m l / C`` (Dr.GRPO 2503.20783), ``C`` = a constant (``max_new_tokens``)."""
  return (_row_sums(values, mask).sum() / norm_constant,
          _valid_rows(mask).sum().astype(_count_dtype()))


@register_loss_agg(SEQUENCE_MEAN, per_sequence=True)
def _sequence_mean(values, mask, norm_constant):
  """``mean_i L_i`` of per-sequence losses ``values[B]`` over rows with a valid token (GMPO).

  Only for objectives with one loss per sequence (they force it); not a ``[B, T]`` aggregation.
  """
  del norm_constant
  return (jnp.where(_valid_rows(mask), values, 0).sum(),
          _valid_rows(mask).sum().astype(_count_dtype()))


def token_level_agg(mode: str) -> str:
  """The ``[B, T]`` aggregation closest to ``mode``: ``mode`` itself, or ``seq_mean_token_mean``
  (a mean over valid sequences) for a per-sequence mode (regularisers under GMPO)."""
  return "seq_mean_token_mean" if LOSS_AGGS.meta(mode).get("per_sequence") else mode


def agg_sum(mode: str, values: chex.Array, mask: chex.Array,
            norm_constant: Optional[chex.Numeric] = None) -> chex.Array:
  """The ``sum`` part of aggregation ``mode`` over ``values[B, T]`` (``[B]`` for a per-sequence
  mode), a scalar. ``norm_constant`` is ``C`` of ``seq_mean_token_sum_norm`` (None = ``T`` =
  max_new_tokens, the padded completion length by construction)."""
  per_sequence = LOSS_AGGS.meta(mode).get("per_sequence", False)
  chex.assert_rank([values, mask], [1 if per_sequence else 2, 2])
  chex.assert_equal_shape_prefix([values, mask], values.ndim)
  if norm_constant is None:
    norm_constant = float(mask.shape[1])
  return LOSS_AGGS.get(mode)(values, mask, norm_constant)[0]


def agg_count(mode: str, mask: chex.Array) -> chex.Array:
  """The ``count`` part of aggregation ``mode``: valid tokens or valid sequences (a scalar)."""
  chex.assert_rank(mask, 2)
  per_sequence = LOSS_AGGS.meta(mode).get("per_sequence", False)
  zeros = jnp.zeros(mask.shape[:1] if per_sequence else mask.shape, _count_dtype())
  return LOSS_AGGS.get(mode)(zeros, mask, 1.0)[1]


# --- rollout correction ------------------------------------------------------------------------

def truncated_is_weights(old_logp: chex.Array, sampler_logp: chex.Array,
                         cap: float) -> chex.Array:
  """Truncated importance sampling: ``sg(min(exp(old_logp - sampler_logp), cap))`` ``[B, T]``."""
  _check_tokens(old_logp, sampler_logp)
  gap = jnp.clip(old_logp - sampler_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return jax.lax.stop_gradient(jnp.minimum(jnp.exp(gap), cap))


# --- entropy bonus -------------------------------------------------------------------------------

def entropy_bonus_mask(mask: chex.Array, entropy_keep: Optional[chex.Array] = None) -> chex.Array:
  """The tokens the entropy bonus averages over: ``m``, or ``m keep`` under the 80/20 mask (8.4,
  as TRL)."""
  return mask if entropy_keep is None else mask * entropy_keep


@register_regularizer("entropy", coef="entropy_coef", token_mask=entropy_bonus_mask)
def entropy_bonus(entropy: chex.Array) -> chex.Array:
  """T1 (arXiv 2501.11651) entropy bonus: ``-H[i, t]`` ``[B, T]``, so that ``coef * agg(-H)``
  added to the loss rewards a high full-vocabulary entropy of the policy,
  ``H[i,t] = -sum_v pi(v) log pi(v)`` at each completion position."""
  return -entropy

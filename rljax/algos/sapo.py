"""SAPO: a soft sigmoid gate instead of PPO's hard clip (docs/algorithms.md, arXiv 2511.20347).

``l[i,t] = -A (4 / tau) sigma(tau (r - 1))`` with ``tau = tau_pos`` where ``A > 0`` and ``tau_neg``
otherwise. Its gradient w.r.t. ``logp`` is ``-A w r`` with ``w = 4 s (1 - s)``,
``s = sigma(tau (r - 1))``: ``w(1) = 1`` (the policy gradient at ``r = 1``) and ``w -> 0`` as
``|r - 1|`` grows, faster for a larger ``tau``. Both forms are aggregated with
``seq_mean_token_mean`` (the registry meta forces it, as verl and TRL do).
"""
from typing import Tuple

import chex
import jax
import jax.numpy as jnp

from rljax.algos.checks import check_range
from rljax.algos.losses import Metrics, log_ratio, token_metrics
from rljax.algos.registry import register_policy_loss

SAPO_LEVELS = ("token", "sequence")
SOFT_CLIP_GATE = 0.5  # ``sapo/soft_clip_frac`` counts tokens whose gate weight w is below this


def _check_tokens(*arrays):
  chex.assert_rank(list(arrays), 2)
  chex.assert_equal_shape(list(arrays))


def _check_temperatures(tau_pos, tau_neg) -> None:
  check_range("algo.sapo_tau_pos", tau_pos, lo=0, lo_open=True)
  check_range("algo.sapo_tau_neg", tau_neg, lo=0, lo_open=True)


def sapo_gate(ratio: chex.Array, advantages: chex.Array, *, tau_pos: float,
              tau_neg: float) -> Tuple[chex.Array, chex.Array]:
  """``(loss, w)`` of the SAPO gate on any ratio (token ``r`` or sequence ``s_i``), elementwise.

  ``loss = -A (4/tau) sigma(tau (ratio - 1))`` (``-2A/tau`` at ``ratio = 1``) and the gate weight
  ``w = 4 s (1 - s)`` (logged; ``d loss / d log ratio = -A w ratio``). ``A = 0`` takes ``tau_neg``.
  """
  _check_temperatures(tau_pos, tau_neg)
  tau = jnp.where(advantages > 0, tau_pos, tau_neg).astype(ratio.dtype)
  s = jax.nn.sigmoid(tau * (ratio - 1.0))
  return -advantages * (4.0 / tau) * s, 4.0 * s * (1.0 - s)


def _sapo_metrics(mask, advantages, ratio, delta, w) -> Metrics:
  valid = mask > 0
  metrics = token_metrics(mask, ratio_mean=ratio, approx_kl=-delta)
  soft_clipped = (w < SOFT_CLIP_GATE).astype(w.dtype)
  metrics.update(token_metrics(mask, **{"sapo/soft_clip_frac": soft_clipped}))
  metrics.update(token_metrics(valid & (advantages > 0), **{"sapo/gate_w_pos": w}))
  metrics.update(token_metrics(valid & (advantages <= 0), **{"sapo/gate_w_neg": w}))
  return metrics


def sapo_loss(logp, old_logp, advantages, mask, *, tau_pos: float = 1.0,
              tau_neg: float = 1.05) -> Tuple[chex.Array, Metrics]:
  """SAPO token form (``algo.sapo_level='token'``): per-token loss ``[B, T]`` and metrics.

  ``r = exp(clip(logp - old_logp, -20, 20))``; ``l = -A (4/tau) sigma(tau (r - 1))``. At
  ``r = e^{+-20}`` the gate saturates (``w = 0``), finite. Metrics (``(sum, count)``):
  ``ratio_mean``, ``approx_kl`` (section 3), ``sapo/gate_w_pos`` / ``sapo/gate_w_neg`` (token-mean
  of ``w`` over tokens with ``A > 0`` / ``A <= 0``) and ``sapo/soft_clip_frac`` (share of valid
  tokens with ``w < 0.5``).
  """
  _check_tokens(logp, old_logp, advantages, mask)
  delta = log_ratio(logp, old_logp)
  ratio = jnp.exp(delta)
  loss, w = sapo_gate(ratio, advantages, tau_pos=tau_pos, tau_neg=tau_neg)
  return loss, _sapo_metrics(mask, advantages, ratio, delta, w)


def sapo_sequence_loss(logp, old_logp, advantages, mask, *, tau_pos: float = 1.0,
                       tau_neg: float = 1.05) -> Tuple[chex.Array, Metrics]:
  """SAPO sequence form (``algo.sapo_level='sequence'``, TRL ``importance_sampling_level``).

  The gate on GSPO's ``s_i = exp(sum_t m delta / |o_i|)``: row loss
  ``L_i = -A_i (4/tau_i) sigma(tau_i (s_i - 1))`` with ``A_i`` the mean of the row's advantages
  over its valid tokens (the outcome advantage). Returned per token ``[B, T]`` (``L_i`` on every
  valid token of row i), so that ``seq_mean_token_mean`` gives ``mean_i L_i`` and the gradient
  reaches every token of the row through ``s_i``. Metrics as ``sapo_loss`` with ``s_i`` as the
  ratio.
  """
  _check_tokens(logp, old_logp, advantages, mask)
  valid = mask > 0
  lengths = jnp.maximum(valid.sum(axis=1), 1).astype(logp.dtype)
  delta = log_ratio(logp, old_logp)
  # A mean of clamped log-ratios, so within [-20, 20] already: exp stays finite.
  seq_ratio = jnp.exp(jnp.where(valid, delta, 0).sum(axis=1) / lengths)
  adv_seq = jnp.where(valid, advantages, 0).sum(axis=1) / lengths.astype(advantages.dtype)
  row_loss, w = sapo_gate(seq_ratio, adv_seq, tau_pos=tau_pos, tau_neg=tau_neg)
  per_token = jnp.where(valid, row_loss[:, None], 0)
  broadcast = lambda x: jnp.broadcast_to(x[:, None], mask.shape)
  metrics = _sapo_metrics(mask, broadcast(adv_seq), broadcast(seq_ratio), delta, broadcast(w))
  return per_token, metrics


@register_policy_loss("sapo", hparams={"tau_pos": "sapo_tau_pos", "tau_neg": "sapo_tau_neg",
                                       "level": "sapo_level"},
                      loss_agg="seq_mean_token_mean")
def sapo_objective(logp, old_logp, advantages, mask, *, tau_pos, tau_neg, level):
  """SAPO (arXiv 2511.20347) at ``algo.sapo_level``: a soft sigmoid gate instead of PPO's clip.

  ``token``: ``l[i,t] = -A (4/tau) sigma(tau (r - 1))``, ``tau = tau_pos`` where ``A > 0`` else
  ``tau_neg``; its gradient ``-A w r`` with ``w = 4 s (1 - s)``, ``s = sigma(tau (r - 1))``, is the
  policy gradient at ``r = 1`` and fades as ``r`` leaves 1 (faster for a larger ``tau``; the loss
  value at ``r = 1`` is ``-2A/tau``). ``sequence``: the same gate on GSPO's
  ``s_i = exp(sum_t m delta / |o_i|)``. Aggregation forced to ``seq_mean_token_mean`` (verl, TRL).
  Metrics: ``sapo/gate_w_pos`` / ``_neg`` and ``sapo/soft_clip_frac`` (``sapo_loss``).
  """
  if level == "token":
    return sapo_loss(logp, old_logp, advantages, mask, tau_pos=tau_pos, tau_neg=tau_neg)
  if level == "sequence":
    return sapo_sequence_loss(logp, old_logp, advantages, mask, tau_pos=tau_pos, tau_neg=tau_neg)
  raise ValueError(f"algo.sapo_level must be one of {SAPO_LEVELS}, got {level!r}")

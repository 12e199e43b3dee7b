"""Pass@k training advantages (docs/algorithms.md).

* ``passk`` (Chen et al., arXiv 2508.10751; ``RUCAIBox/Passk_Training`` ``calc_adv``): the analytic
  expectation over all ``C(G, k)`` k-subsets of a group, each rewarded by its best member. Per
  group with ``c`` correct of ``G`` binary rewards: ``Rbar = 1 - C(G-c, k)/C(G, k)``,
  ``sd = sqrt(Rbar (1 - Rbar))``; correct rows ``A = (1 - Rbar)/(sd + 1e-6)``, wrong rows
  ``A = (1 - Rbar - C(G-c-1, k-1)/C(G-1, k-1))/(sd + 1e-6)``.
* ``passk_n`` (Tang et al., arXiv 2503.19595; verl ``grpo_passk``): a pass@G leave-one-out; only
  the row with the maximum reward gets ``(R_max - R_second)/(std + 1e-6)``, the others 0.

Both broadcast the row advantage over the row's valid tokens (0 on padding).
"""
import functools
import numbers
from math import comb
from typing import Tuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.algos.advantages import GRPO_STD_EPS, _broadcast, to_groups
from rljax.algos.losses import Metrics
from rljax.algos.registry import register_advantage

PASSK_N_STD_MODES = ("group", "none")


def _binom(n: int, k: int) -> int:
  """``C(n, k)``, 0 when ``k > n`` or ``n < 0`` (or ``k < 0``)."""
  return comb(n, k) if 0 <= k <= n else 0


def passk_table(group_size: int, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Host-side float64 tables ``(A_pos[c], A_neg[c], Rbar[c])`` for ``c = 0..G`` correct rows.

  Exact integer binomials; the two ratios are formed from Python ints before one rounding. When
  ``c = 0``, ``c = G`` or ``G - c < k``, ``Rbar`` is 0 or 1 and both advantages are exactly 0.
  """
  def integer(x):
    return not isinstance(x, bool) and isinstance(x, numbers.Integral)

  if not integer(group_size) or group_size < 2:
    raise ValueError(f"algo.advantage='passk' needs rollout.group_size >= 2, got {group_size!r}")
  if not integer(k) or not 1 <= k <= group_size:
    raise ValueError(f"algo.passk_k must be an integer in [1, rollout.group_size={group_size}], "
                     f"got {k!r}")
  return _passk_table(int(group_size), int(k))


@functools.lru_cache(maxsize=None)
def _passk_table(g: int, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  a_pos, a_neg, r_bar = np.zeros(g + 1), np.zeros(g + 1), np.zeros(g + 1)
  for c in range(g + 1):
    rb = 1.0 - _binom(g - c, k) / _binom(g, k)
    sd = np.sqrt(rb * (1.0 - rb))
    r_bar[c] = rb
    a_pos[c] = (1.0 - rb) / (sd + GRPO_STD_EPS)
    a_neg[c] = (1.0 - rb - _binom(g - c - 1, k - 1) / _binom(g - 1, k - 1)) / (sd + GRPO_STD_EPS)
  for table in (a_pos, a_neg, r_bar):
    table.flags.writeable = False  # cached: shared by every caller
  return a_pos, a_neg, r_bar


def _raise_non_binary(any_bad):
  if bool(any_bad):
    raise ValueError("algo.advantage='passk' needs binary rewards in {0, 1} (e.g. reward.fn "
                     "1 correct / 0 wrong); got another value")


def check_binary_rewards(rewards: chex.Array) -> None:
  """Raise unless every reward is 0 or 1. On concrete arrays it raises here; under ``jit`` the
  check runs as a host callback and the error surfaces when the result is read."""
  bad = ~((rewards == 0) | (rewards == 1)).all()
  if isinstance(bad, jax.core.Tracer):
    jax.debug.callback(_raise_non_binary, bad)
  else:
    _raise_non_binary(bad)


def _row_metrics(rows_ok, **per_row) -> Metrics:
  count = rows_ok.sum().astype(jnp.result_type(float))
  return {name: (jnp.where(rows_ok, v, 0).sum().astype(count.dtype), count)
          for name, v in per_row.items()}


def _passk_rows(rewards, group_size, k):
  """``(A per row [B], Rbar per group [P], correct per row [B])``."""
  groups = to_groups(rewards, group_size)
  check_binary_rewards(groups)
  a_pos, a_neg, r_bar = (jnp.asarray(t, groups.dtype) for t in passk_table(group_size, k))
  correct = groups == 1
  c = correct.sum(axis=1)
  adv = jnp.where(correct, a_pos[c][:, None], a_neg[c][:, None]).reshape(-1)
  return adv, r_bar[c], correct.reshape(-1)


@register_advantage("passk", hparams={"k": "passk_k"})
def passk_advantages(rewards: chex.Array, mask: chex.Array, group_size: int, *,
                     k: int) -> chex.Array:
  """Pass@k training (Chen et al., arXiv 2508.10751) advantages ``[B, T]``
  (``algo.advantage='passk'``, ``algo.passk_k = k``): the analytic expectation over all
  ``C(G, k)`` k-subsets of a group, each rewarded by its best member.

  With ``c`` correct of ``G``: ``Rbar = 1 - C(G-c, k)/C(G, k)``, ``sd = sqrt(Rbar (1 - Rbar))``;
  correct rows ``A = (1 - Rbar)/(sd + 1e-6)``, wrong rows
  ``A = (1 - Rbar - C(G-c-1, k-1)/C(G-1, k-1))/(sd + 1e-6)``; exactly 0 when ``c = 0``, ``c = G``
  or ``G - c < k``. Requires ``1 <= k <= G``.

  ``rewards[B]`` must be binary (an error otherwise; the reference code passes other values
  through). With ``k = 1`` this equals ``(R - mean_g R)/(std_pop + 1e-6)``, the population std.
  A group's advantages do not sum to 0 in general.
  """
  adv, _, _ = _passk_rows(rewards, group_size, k)
  return _broadcast(adv, mask)


def passk_metrics(rewards: chex.Array, mask: chex.Array, group_size: int, *,
                  k: int) -> Metrics:
  """``passk/`` metrics as ``(sum, count)``: ``estimate`` (group-mean ``Rbar``), ``adv_pos_mean`` /
  ``adv_neg_mean`` (row-mean of ``A`` over correct / wrong rows), ``zero_frac`` (share of rows
  with ``A = 0``); rows without a valid token are left out, groups without one too."""
  adv, r_bar, correct_rows = _passk_rows(rewards, group_size, k)
  rows_ok = (mask > 0).any(axis=1)
  groups_ok = rows_ok.reshape(r_bar.shape[0], -1).any(axis=1)
  metrics = _row_metrics(groups_ok, **{"passk/estimate": r_bar})
  metrics.update(_row_metrics(rows_ok & correct_rows, **{"passk/adv_pos_mean": adv}))
  metrics.update(_row_metrics(rows_ok & ~correct_rows, **{"passk/adv_neg_mean": adv}))
  metrics.update(_row_metrics(rows_ok, **{"passk/zero_frac": (adv == 0).astype(adv.dtype)}))
  return metrics


@register_advantage("passk_n", hparams={"std_mode": "adv_std"})
def passk_n_advantages(rewards: chex.Array, mask: chex.Array, group_size: int, *,
                       std_mode: str = "group") -> chex.Array:
  """verl's ``grpo_passk`` (Tang et al., arXiv 2503.19595) advantages ``[B, T]``.

  Per group, only the row with the maximum reward (ties: the lowest index) gets
  ``(R_max - R_second)/(std + 1e-6)``, std Bessel-corrected (``std_mode='group'``), or the raw
  difference (``std_mode='none'``, ``algo.adv_std``); every other row gets 0. Any real rewards.
  """
  if std_mode not in PASSK_N_STD_MODES:
    raise ValueError(f"algo.adv_std must be one of {PASSK_N_STD_MODES} with "
                     f"algo.advantage='passk_n', got {std_mode!r}")
  groups = to_groups(rewards, group_size)
  top_two = jax.lax.top_k(groups, 2)[0]  # ties: top_k keeps the lower index first
  gap = top_two[:, 0] - top_two[:, 1]
  if std_mode == "group":
    gap = gap / (jnp.std(groups, axis=1, ddof=1) + GRPO_STD_EPS)
  winner = jnp.argmax(groups, axis=1)  # first maximum
  is_winner = jnp.arange(group_size)[None, :] == winner[:, None]
  adv = jnp.where(is_winner, gap[:, None], jnp.zeros((), groups.dtype)).reshape(-1)
  return _broadcast(adv, mask)

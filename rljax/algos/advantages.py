"""Advantage estimators (docs/algorithms.md section 2).

Shapes: ``B = P * G`` rollout rows, groups contiguous (rows ``p*G .. p*G+G-1`` share a prompt);
``T`` completion tokens per row; ``mask[B, T]`` is 1 on real completion tokens.

Every estimator returns ``advantages[B, T]`` that are exactly 0 on padding. Which inputs each uses:

| estimator               | uses                                   | returns (critic targets) |
|-------------------------|----------------------------------------|--------------------------|
| grpo, dr_grpo, rloo, gpg| ``rewards[B]``, mask (broadcast only)  | None                     |
| opo                     | ``rewards[B]``, mask (lengths |o_i|)   | None                     |
| reinforce_pp_baseline   | ``rewards[B]``, mask                   | None                     |
| reinforce_pp            | ``token_rewards[B, T]``, mask          | None                     |
| gae                     | ``token_rewards[B, T]``, ``values[B,T]``, mask | ``[B, T]``       |

Each estimator is registered as it is (``rljax.algos.registry``): its positional parameters name
the arrays it reads, its keyword-only ones the ``algo.*`` hyperparameters.

``token_rewards`` is the per-token reward with the outcome ``R_i`` already on the last valid token
(and ``-beta k`` on every token when ``algo.kl_placement='reward'``): build it with
``rljax.algos.kl.kl_reward_tokens`` or ``outcome_token_rewards``.
"""
import numbers
from typing import Optional, Tuple, Union

import chex
import jax
import jax.numpy as jnp

from rljax.algos.registry import register_advantage
from rljax.config.table import options

GRPO_STD_EPS = 1e-6
WHITEN_EPS = 1e-8
ADV_STD_MODES = options("algo.adv_std")


# --- helpers -------------------------------------------------------------------------------------

def _float(x: chex.Array) -> chex.Array:
  x = jnp.asarray(x)
  return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def to_groups(rewards: chex.Array, group_size: int) -> chex.Array:
  """``rewards[B] -> [P, G]`` (groups contiguous). Raises if ``G < 2`` or ``B % G != 0``."""
  chex.assert_rank(rewards, 1)
  if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 2:
    raise ValueError(
        f"group advantage estimators need rollout.group_size >= 2 (a baseline from the other "
        f"completions of the prompt), got group_size={group_size!r}")
  group_size = int(group_size)
  batch = rewards.shape[0]
  if batch % group_size:
    raise ValueError(f"batch of {batch} rows is not a whole number of groups of "
                     f"rollout.group_size={group_size}")
  return _float(rewards).reshape(batch // group_size, group_size)


def _zero_spread(groups: chex.Array) -> chex.Array:
  """``[P, 1]`` True where every reward of the group is equal.

  Tested on max == min, not on a computed std: the mean of G equal floats is not always bitwise
  equal to them, and ``R - mean`` would then leak a tiny non-zero advantage.
  """
  return (groups.max(axis=1, keepdims=True) == groups.min(axis=1, keepdims=True))


def _group_present(mask: chex.Array, num_groups: int) -> chex.Array:
  """``[P, 1]`` True for groups with at least one valid token. A group without any is padding
  (dynamic sampling fills a short batch with zero-mask groups) and is left out of batch-level
  statistics, so that padding changes no advantage."""
  return (mask > 0).reshape(num_groups, -1).any(axis=1, keepdims=True)


def _broadcast(adv_rows: chex.Array, mask: chex.Array) -> chex.Array:
  """``A[i, t] = A_i * m[i, t]``: ``[B] x [B, T] -> [B, T]``."""
  chex.assert_rank([adv_rows, mask], [1, 2])
  chex.assert_equal_shape_prefix([adv_rows, mask], 1)
  return jnp.where(mask > 0, adv_rows[:, None], jnp.zeros((), adv_rows.dtype))


def sequence_lengths(mask: chex.Array) -> chex.Array:
  """``|o_i| = sum_t m[i, t]``: ``[B, T] -> [B]``."""
  chex.assert_rank(mask, 2)
  return (mask > 0).sum(axis=1)


def outcome_token_rewards(rewards: chex.Array, mask: chex.Array) -> chex.Array:
  """Per-token rewards ``[B, T]``: ``R_i`` on the last valid token of row i, 0 elsewhere.

  Rows without a valid token get no reward (they take no part in any loss).
  """
  chex.assert_rank([rewards, mask], [1, 2])
  chex.assert_equal_shape_prefix([rewards, mask], 1)
  rewards = _float(rewards)
  valid = mask > 0
  length = valid.shape[1]
  # Index of the last valid token: first valid from the right.
  last = length - 1 - jnp.argmax(valid[:, ::-1], axis=1)
  at_last = (jnp.arange(length)[None, :] == last[:, None]) & valid.any(axis=1, keepdims=True)
  return jnp.where(at_last, rewards[:, None], jnp.zeros((), rewards.dtype))


def whiten(x: chex.Array, mask: chex.Array, eps: float = WHITEN_EPS) -> chex.Array:
  """Token-weighted whitening over all valid tokens of the batch: ``[B, T] -> [B, T]``.

  ``(x - mean) / sqrt(var + eps)`` with mean and variance over entries with ``m = 1``, the
  variance Bessel-corrected (``n / (n - 1)``); padded entries are 0 in the output.
  """
  chex.assert_rank([x, mask], [2, 2])
  chex.assert_equal_shape([x, mask])
  x = _float(x)
  valid = mask > 0
  m = valid.astype(x.dtype)
  n = m.sum()
  xv = jnp.where(valid, x, 0)
  mean = xv.sum() / jnp.maximum(n, 1)
  centred = jnp.where(valid, x - mean, 0)
  var = (centred ** 2).sum() / jnp.maximum(n - 1, 1)
  return centred * jax.lax.rsqrt(var + eps)


def _reverse_gae(token_rewards, values, mask, gamma, lam):
  """GAE over the valid tokens of each row, scanning ``T`` backwards.

  The carry is (value of the next valid token, its advantage); a padded position leaves it
  untouched, so the value after the last valid token is 0 and holes in the mask are skipped.
  ``lam`` is a scalar or a per-row ``[B]`` array.
  """
  lam = jnp.broadcast_to(jnp.asarray(lam, token_rewards.dtype), token_rewards.shape[:1])
  valid = mask > 0

  def step(carry, xs):
    next_value, next_adv = carry
    r, v, ok = xs
    delta = r + gamma * next_value - v
    adv = delta + gamma * lam * next_adv
    carry = (jnp.where(ok, v, next_value), jnp.where(ok, adv, next_adv))
    return carry, jnp.where(ok, adv, 0)

  init = (jnp.zeros_like(lam), jnp.zeros_like(lam))
  _, adv = jax.lax.scan(step, init, (token_rewards.T, values.T, valid.T), reverse=True)
  return adv.T


# --- outcome (group) estimators ------------------------------------------------------------------

@register_advantage("grpo", hparams={"std_mode": "adv_std"})
def grpo_advantages(rewards: chex.Array, mask: chex.Array, group_size: int, *,
                    std_mode: str = "group", eps: float = GRPO_STD_EPS) -> chex.Array:
  """GRPO (arXiv 2402.03300): ``A_i = (R_i - mean_g R) / (std R + eps)``, broadcast to ``[B, T]``.

  ``std_mode``: ``group`` (std of the prompt's group), ``batch`` (std of all ``B`` rewards; groups
  without a valid token, i.e. padding, left out) or ``none`` (no division: Dr.GRPO, arXiv
  2503.20783). Std is Bessel-corrected. Groups with zero reward spread get ``A = 0``.
  """
  if std_mode not in ADV_STD_MODES:
    raise ValueError(f"algo.adv_std must be one of {ADV_STD_MODES}, got {std_mode!r}")
  groups = to_groups(rewards, group_size)
  centred = groups - groups.mean(axis=1, keepdims=True)
  if std_mode == "group":
    adv = centred / (jnp.std(groups, axis=1, ddof=1, keepdims=True) + eps)
  elif std_mode == "batch":
    present = jnp.broadcast_to(_group_present(mask, groups.shape[0]), groups.shape)
    n = present.sum()
    mean = jnp.where(present, groups, 0).sum() / jnp.maximum(n, 1)
    var = jnp.where(present, (groups - mean) ** 2, 0).sum() / jnp.maximum(n - 1, 1)
    adv = centred / (jnp.sqrt(var) + eps)
  else:
    adv = centred
  adv = jnp.where(_zero_spread(groups), 0, adv)
  return _broadcast(adv.reshape(-1), mask)


@register_advantage("dr_grpo")
def dr_grpo_advantages(rewards: chex.Array, mask: chex.Array, group_size: int) -> chex.Array:
  """Dr.GRPO (arXiv 2503.20783): ``A_i = R_i - mean_g R`` (GRPO without std division)."""
  return grpo_advantages(rewards, mask, group_size, std_mode="none")


@register_advantage("rloo")
def rloo_advantages(rewards: chex.Array, mask: chex.Array, group_size: int) -> chex.Array:
  """RLOO (arXiv 2402.14740): ``A_i = R_i - mean_{j != i} R_j = G/(G-1) (R_i - mean_g R)``."""
  groups = to_groups(rewards, group_size)
  adv = group_size / (group_size - 1) * (groups - groups.mean(axis=1, keepdims=True))
  adv = jnp.where(_zero_spread(groups), 0, adv)
  return _broadcast(adv.reshape(-1), mask)


@register_advantage("opo")
def opo_advantages(rewards: chex.Array, mask: chex.Array, group_size: int) -> chex.Array:
  """OPO (Hao et al., arXiv 2505.23585) length-weighted baseline, within the group:
  ``A_i = R_i - sum_j |o_j| R_j / sum_j |o_j|`` (the variance-optimal baseline when a sequence's
  squared gradient norm grows with its length).

  A group whose completions are all empty falls back to the plain mean (its tokens are all
  padding, so the value never reaches a loss; the fallback only keeps it finite).
  """
  groups = to_groups(rewards, group_size)
  lengths = sequence_lengths(mask).astype(groups.dtype).reshape(groups.shape)
  total = lengths.sum(axis=1, keepdims=True)
  weighted = (lengths * groups).sum(axis=1, keepdims=True) / jnp.maximum(total, 1)
  baseline = jnp.where(total > 0, weighted, groups.mean(axis=1, keepdims=True))
  adv = jnp.where(_zero_spread(groups), 0, groups - baseline)
  return _broadcast(adv.reshape(-1), mask)


@register_advantage("gpg")
def gpg_advantages(rewards: chex.Array, mask: chex.Array, group_size: int) -> chex.Array:
  """GPG (arXiv 2504.02546): ``A_i = alpha (R_i - mean_g R)``, ``alpha = P / (P - M)``.

  ``M`` = groups with zero reward spread, so ``alpha`` rescales the gradient to the valid groups.
  When every group has zero spread all advantages are 0 and ``alpha`` is irrelevant (guarded).
  ``P`` and ``M`` count the prompts of the batch: groups without a valid token (padding) are not
  among them.
  """
  groups = to_groups(rewards, group_size)
  flat = _zero_spread(groups)
  present = _group_present(mask, groups.shape[0])
  num_prompts = present.sum()
  num_valid = num_prompts - (flat & present).sum()
  alpha = num_prompts / jnp.maximum(num_valid, 1).astype(groups.dtype)
  adv = jnp.where(flat, 0, alpha * (groups - groups.mean(axis=1, keepdims=True)))
  return _broadcast(adv.reshape(-1), mask)


@register_advantage("reinforce_pp_baseline", whitened=True)
def reinforce_pp_baseline_advantages(rewards: chex.Array, mask: chex.Array,
                                     group_size: int) -> chex.Array:
  """REINFORCE++-baseline (arXiv 2501.03262): ``A = whiten((R_i - mean_g R) m)``, the group
  baseline, then token-weighted whitening over the batch (``whiten``).

  Uses the outcome rewards only (a KL-in-reward term is not part of this estimator's formula).
  """
  return whiten(dr_grpo_advantages(rewards, mask, group_size), mask)


# --- token-level estimators ----------------------------------------------------------------------

def discounted_returns(token_rewards: chex.Array, mask: chex.Array, gamma: float) -> chex.Array:
  """Returns-to-go over valid tokens: ``G_t = r_t + gamma G_{t'}`` (t' the next valid token)."""
  chex.assert_rank([token_rewards, mask], [2, 2])
  chex.assert_equal_shape([token_rewards, mask])
  token_rewards = _float(token_rewards)
  return _reverse_gae(token_rewards, jnp.zeros_like(token_rewards), mask, gamma, 1.0)


@register_advantage("reinforce_pp", whitened=True)
def reinforce_pp_advantages(token_rewards: chex.Array, mask: chex.Array, *,
                            gamma: float) -> chex.Array:
  """REINFORCE++ (arXiv 2501.03262): returns-to-go of the token rewards, whitened over the batch:
  ``A[i,t] = whiten(sum_{u>=t} gamma^(u-t) m r[i,u])`` (``whiten`` over all valid tokens).

  ``token_rewards[B, T]`` carries the outcome ``R_i`` on the last valid token and the KL-in-reward
  term on every token.
  """
  return whiten(discounted_returns(token_rewards, mask, gamma), mask)


def length_adaptive_lam(mask: chex.Array, alpha: float) -> chex.Array:
  """VAPO (arXiv 2504.05118): ``lam_i = 1 - 1 / (alpha |o_i|)`` clamped to [0, 1]; ``[B]``."""
  lengths = sequence_lengths(mask).astype(jnp.result_type(float))
  lam = 1.0 - 1.0 / (alpha * jnp.maximum(lengths, 1))
  return jnp.where(lengths > 0, jnp.clip(lam, 0.0, 1.0), 0.0)


def gae_advantages(token_rewards: chex.Array, values: chex.Array, mask: chex.Array, *,
                   gamma: float, lam: Union[float, chex.Array]) -> chex.Array:
  """GAE (PPO, arXiv 1707.06347) over valid tokens: ``[B, T] -> [B, T]``.

  ``delta_t = r_t + gamma V_{t+1} - V_t`` with ``V`` after the last valid token = 0,
  ``A_t = delta_t + gamma lam A_{t+1}``. ``lam`` is a float or per-row ``[B]`` (length-adaptive).
  """
  chex.assert_rank([token_rewards, values, mask], [2, 2, 2])
  chex.assert_equal_shape([token_rewards, values, mask])
  token_rewards = _float(token_rewards)
  return _reverse_gae(token_rewards, values.astype(token_rewards.dtype), mask, gamma, lam)


def gae_returns(token_rewards: chex.Array, values: chex.Array, mask: chex.Array, *,
                gamma: float, lam: Union[float, chex.Array]) -> chex.Array:
  """Critic targets ``GAE(lam) + V`` on valid tokens, 0 on padding (decoupled GAE, 2503.01491)."""
  adv = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
  return jnp.where(mask > 0, adv + values.astype(adv.dtype), 0)


# --- GAE as one registered estimator ---------------------------------------------------------------

# With lam_alpha set the length-adaptive lambda replaces lam everywhere (policy and, without
# lam_critic, critic): lam is then read by nothing.
@register_advantage("gae", critic_targets=True,
                    ignored_keys=lambda a: {"lam"} if a["lam_alpha"] is not None else set())
def gae_estimator(token_rewards: chex.Array, values: chex.Array, mask: chex.Array, *,
                  gamma: chex.Numeric, lam: chex.Numeric, lam_alpha: Optional[chex.Numeric],
                  lam_critic: Optional[chex.Numeric]) -> Tuple[chex.Array, chex.Array]:
  """GAE advantages and critic targets ``([B, T], [B, T])`` (Schulman et al., arXiv 1506.02438):
  PPO (``lam_critic=None``: the policy's lambda), decoupled GAE (VC-PPO 2503.01491:
  ``lam_critic``, 1.0 = Monte-Carlo returns) and length-adaptive GAE (VAPO 2504.05118:
  ``lam_alpha`` sets a per-row lambda).

  ``delta_t = r_t + gamma V_{t+1} - V_t`` (``V`` after the last valid token is 0),
  ``A_t = delta_t + gamma lam A_{t+1}`` over valid tokens; critic targets ``GAE(lam_critic) + V``.
  Length-adaptive: ``lam_i = clip(1 - 1/(lam_alpha |o_i|), 0, 1)`` per row (VAPO: 0.05).
  Whitened afterwards when ``algo.adv_whiten`` (the PPO presets).
  """
  if lam_alpha is not None:
    lam = length_adaptive_lam(mask, lam_alpha)
  adv = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
  if lam_critic is None:
    # The critic bootstraps with the policy's lambda (the adaptive one included): reuse the scan.
    return adv, jnp.where(mask > 0, adv + values.astype(adv.dtype), 0)
  return adv, gae_returns(token_rewards, values, mask, gamma=gamma, lam=lam_critic)

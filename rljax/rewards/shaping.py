"""Reward shaping of docs/algorithms.md section 1 (verifiers live elsewhere in ``rljax.rewards``).

Lengths are counted in **tokens** of the completion (``|o_i| = sum_t m[i, t]``), never characters.
"""
import chex
import jax.numpy as jnp
import numpy as np


def overlong_penalty(lengths: chex.Array, *, max_new_tokens: int, overlong_buffer: int,
                     overlong_penalty: float) -> chex.Array:
  """DAPO soft overlong punishment (arXiv 2503.14476): the term added to ``R_i``, ``[B]`` float.

  With ``Lmax = max_new_tokens`` and ``Lc = overlong_buffer``: 0 if ``|o| <= Lmax - Lc``;
  ``((Lmax - Lc) - |o|) / Lc * penalty`` if ``Lmax - Lc < |o| <= Lmax``; ``-penalty`` beyond.
  ``overlong_buffer = 0`` turns it off (all zeros). NumPy lengths give a NumPy array: the
  rollout's host scoring calls it once per batch, where eager JAX ops cost milliseconds.
  """
  chex.assert_rank(lengths, 1)
  if overlong_buffer < 0 or overlong_buffer > max_new_tokens:
    raise ValueError(f"reward.overlong_buffer must be in [0, max_new_tokens={max_new_tokens}], "
                     f"got {overlong_buffer}")
  xp = np if isinstance(lengths, np.ndarray) else jnp
  dtype = jnp.result_type(float)
  lengths = xp.asarray(lengths).astype(dtype)
  if overlong_buffer == 0:
    return xp.zeros_like(lengths)
  start = float(max_new_tokens - overlong_buffer)
  ramp = (start - lengths) / overlong_buffer * overlong_penalty
  return xp.where(lengths <= start, 0.0,
                  xp.where(lengths <= max_new_tokens, ramp, -overlong_penalty)).astype(dtype)


def overlong_filter_mask(mask: chex.Array, truncated: chex.Array) -> chex.Array:
  """DAPO overlong filtering: ``m[i, :] = 0`` for truncated rows; ``[B, T], [B] -> [B, T]``.

  Apply *after* advantages are computed over the full group (``algo.overlong_filter``), so the
  truncated completions still count in their group's baseline but receive no gradient.
  """
  chex.assert_rank([mask, truncated], [2, 1])
  chex.assert_equal_shape_prefix([mask, truncated], 1)
  keep = jnp.logical_not(jnp.asarray(truncated).astype(bool))[:, None]
  return jnp.where(keep, mask, jnp.zeros((), mask.dtype))

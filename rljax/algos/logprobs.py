"""Token log-probs and entropies from the LM head without materialising ``[B, T, V]`` logits.

A 152k vocabulary at ``B x T = 8 x 1024`` is 5 GB of float32 logits, more in the backward pass.
``token_logprobs_and_entropy`` projects one sequence chunk at a time inside ``lax.map``; the
backward recomputes each chunk's logits from per-token ``log Z`` and entropy (``_chunk_stats``'s
custom VJP), so the peak is a few ``[B, chunk, V]`` float32 buffers whichever way it is
differentiated.
"""
import functools

import chex
import jax
import jax.numpy as jnp


def logprobs_from_logits(logits: chex.Array, targets: chex.Array) -> chex.Array:
  """``log softmax(logits)[target]`` in float32: ``[..., V], [...] -> [...]``."""
  chex.assert_rank(logits, targets.ndim + 1)
  chex.assert_equal_shape_prefix([logits, targets], targets.ndim)
  logp_all = jax.nn.log_softmax(logits.astype(_logits_dtype(logits)), axis=-1)
  return jnp.take_along_axis(logp_all, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy_from_logits(logits: chex.Array) -> chex.Array:
  """Full-vocabulary entropy ``H = -sum_v p_v log p_v`` in float32: ``[..., V] -> [...]``."""
  return _entropy(jax.nn.log_softmax(logits.astype(_logits_dtype(logits)), axis=-1))


def _entropy(logp_all):
  # -sum p log p from the normalised log-probs, not logZ - sum p z: the latter cancels two
  # numbers of the size of the logits and loses the entropy of a peaked distribution in float32.
  return -(jnp.exp(logp_all) * logp_all).sum(axis=-1)


def _logits_dtype(*arrays):
  """float32, or float64 when an input already is (jax_enable_x64 tests)."""
  return jnp.promote_types(jnp.result_type(*arrays), jnp.float32)


def _logits(hidden, head, temperature, softcap):
  """``(z, raw)``: the chunk's logits ``z = cap * tanh(raw / cap) / temperature`` and the
  projection ``raw = hidden @ head``, both accumulated in float32."""
  raw = jnp.einsum("bcd,dv->bcv", hidden, head,
                   preferred_element_type=_logits_dtype(hidden, head))
  z = raw if softcap is None else jnp.tanh(raw / softcap) * softcap
  return (z if temperature == 1.0 else z / temperature), raw


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunk_stats(hidden, head, targets, temperature, softcap):
  """``[B, c, D], [D, V], [B, c] -> (logp [B, c], entropy [B, c])``, float32 logits.

  Differentiated through ``_chunk_stats_bwd``, which keeps only the per-token ``log Z`` and
  entropy: the backward recomputes the logits with one matmul and forms their cotangent in one
  elementwise pass, instead of re-running the forward's reductions (``jax.checkpoint``).
  """
  return _chunk_stats_fwd(hidden, head, targets, temperature, softcap)[0]


def _chunk_stats_fwd(hidden, head, targets, temperature, softcap):
  z, _ = _logits(hidden, head, temperature, softcap)
  log_z = jax.nn.logsumexp(z, axis=-1)
  logp_all = z - log_z[..., None]
  logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
  entropy = _entropy(logp_all)
  return (logp, entropy), (hidden, head, targets, log_z, entropy)


def _chunk_stats_bwd(temperature, softcap, residuals, cotangents):
  """With ``p = softmax(z)`` and ``H = -sum p log p``: ``d logp_t / dz = onehot_t - p`` and
  ``dH / dz = -p (log p + H)``; then the chain through the temperature and the soft cap
  (``d z / d raw = (1 - tanh^2(raw / cap)) / temperature``). The cotangent of the logits is
  cast to the operands' dtype before the two matmuls, which accumulate in float32: bfloat16
  products as mixed precision runs every other matmul (float32 would run as TF32 on a GPU);
  with float32 operands nothing is rounded."""
  hidden, head, targets, log_z, entropy = residuals
  g_logp, g_entropy = cotangents
  z, raw = _logits(hidden, head, temperature, softcap)
  logp_all = z - log_z[..., None]
  p = jnp.exp(logp_all)
  target = jnp.arange(z.shape[-1]) == targets[..., None]
  dz = g_logp[..., None] * (target - p) - g_entropy[..., None] * p * (logp_all
                                                                        + entropy[..., None])
  if temperature != 1.0:
    dz = dz / temperature
  if softcap is not None:
    dz = dz * (1.0 - jnp.square(jnp.tanh(raw / softcap)))
  acc = _logits_dtype(hidden, head)
  dz = dz.astype(jnp.promote_types(hidden.dtype, head.dtype))
  d_hidden = jnp.einsum("bcv,dv->bcd", dz, head, preferred_element_type=acc)
  d_head = jnp.einsum("bcd,bcv->dv", hidden, dz, preferred_element_type=acc)
  return d_hidden.astype(hidden.dtype), d_head.astype(head.dtype), None


_chunk_stats.defvjp(_chunk_stats_fwd, _chunk_stats_bwd)


def token_logprobs_and_entropy(hidden: chex.Array, head: chex.Array, targets: chex.Array, *,
                               chunk: int, temperature: float = 1.0,
                               softcap: float | None = None) -> tuple[chex.Array, chex.Array]:
  """Log-prob of ``targets`` and full-vocabulary entropy under ``softmax(hidden @ head / temp)``
  (the logits first soft-capped, ``cap * tanh(logits / cap)``, for a model that caps them).

  Args:
    hidden: ``[B, T, D]`` final hidden states (after the last norm), any float dtype.
    head: ``[D, V]`` output projection (the transposed embedding when tied).
    targets: ``[B, T]`` int token ids.
    chunk: sequence positions per chunk; peak memory is a few ``B * chunk * V`` float32 buffers.
    temperature: divide the logits (match the sampler's temperature when it is not 1).

  Returns:
    ``(logp [B, T], entropy [B, T])``, float32 (float64 for float64 inputs); differentiable
    w.r.t. ``hidden`` and ``head``.
  """
  chex.assert_rank([hidden, head, targets], [3, 2, 2])
  chex.assert_equal_shape_prefix([hidden, targets], 2)
  if hidden.shape[-1] != head.shape[0]:
    raise ValueError(f"hidden size {hidden.shape[-1]} != head input size {head.shape[0]}")
  if chunk < 1:
    raise ValueError(f"chunk (model.logits_chunk) must be >= 1, got {chunk}")
  batch, length, dim = hidden.shape
  chunk = min(chunk, length)
  num_chunks = -(-length // chunk)
  pad = num_chunks * chunk - length
  targets = targets.astype(jnp.int32)
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  # [B, n*c, ...] -> [n, B, c, ...]: lax.map iterates over chunks.
  hidden_chunks = hidden.reshape(batch, num_chunks, chunk, dim).swapaxes(0, 1)
  target_chunks = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

  def body(xs):
    h, t = xs
    return _chunk_stats(h, head, t, temperature, softcap)

  logp, entropy = jax.lax.map(body, (hidden_chunks, target_chunks))
  logp = logp.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]
  entropy = entropy.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]
  return logp, entropy

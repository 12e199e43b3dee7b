"""Token log-probs and entropies from the LM head without materialising ``[B, T, V]`` logits.

A 152k vocabulary at ``B x T = 8 x 1024`` is 5 GB of float32 logits, more in the backward pass.
``token_logprobs_and_entropy`` projects one sequence chunk at a time inside ``lax.map`` and
rematerialises the chunk in the backward pass (``jax.checkpoint``), so the peak is a few
``[B, chunk, V]`` float32 buffers whichever way it is differentiated.
"""
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


@jax.custom_vjp
def project(hidden, head):
  """Logits ``hidden @ head`` accumulated and returned in float32: ``[B, c, D], [D, V] ->
  [B, c, V]``, whose backward runs in the operands' dtype.

  Differentiated as is, a float32 output makes its cotangent float32, so both backward matmuls
  over the vocabulary would run in float32 (TF32 on a GPU) although the forward ran in
  bfloat16. Here the cotangent is cast to the operands' dtype first and the products accumulate
  in float32, as mixed-precision training does for every other matmul (autocast); with float32
  operands nothing changes.
  """
  return jnp.einsum("bcd,dv->bcv", hidden, head,
                    preferred_element_type=_logits_dtype(hidden, head))


def _project_fwd(hidden, head):
  return project(hidden, head), (hidden, head)


def _project_bwd(operands, cotangent):
  hidden, head = operands
  acc = _logits_dtype(hidden, head)
  g = cotangent.astype(jnp.promote_types(hidden.dtype, head.dtype))
  d_hidden = jnp.einsum("bcv,dv->bcd", g, head, preferred_element_type=acc)
  d_head = jnp.einsum("bcd,bcv->dv", hidden, g, preferred_element_type=acc)
  return d_hidden.astype(hidden.dtype), d_head.astype(head.dtype)


project.defvjp(_project_fwd, _project_bwd)


def _chunk_stats(hidden, head, targets, temperature, softcap):
  """``[B, c, D], [D, V], [B, c] -> (logp [B, c], entropy [B, c])``, float32 logits."""
  logits = project(hidden, head)
  if softcap is not None:
    logits = jnp.tanh(logits / softcap) * softcap
  if temperature != 1.0:
    logits = logits / temperature
  logp_all = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
  return logp, _entropy(logp_all)


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

  # Checkpointing the body makes the backward pass recompute each chunk's logits instead of
  # keeping every chunk's [B, c, V] residuals alive at once.
  @jax.checkpoint
  def body(xs):
    h, t = xs
    return _chunk_stats(h, head, t, temperature, softcap)

  logp, entropy = jax.lax.map(body, (hidden_chunks, target_chunks))
  logp = logp.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]
  entropy = entropy.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]
  return logp, entropy

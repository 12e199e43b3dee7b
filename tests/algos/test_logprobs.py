"""Chunked token log-probs and entropies: values, gradients, and peak memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos import logprobs as lp_lib

from .helpers import jit

B, T, D, V = 2, 7, 4, 11


def np_logprobs_entropy(hidden, head, targets, temperature=1.0):
  logits = hidden.astype(np.float64) @ head.astype(np.float64) / temperature
  logits = logits - logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits).sum(-1, keepdims=True))
  logp_all = logits - log_z
  logp = np.take_along_axis(logp_all, targets[..., None], -1)[..., 0]
  entropy = -(np.exp(logp_all) * logp_all).sum(-1)
  return logp, entropy


def make(seed, dtype=np.float32):
  rng = np.random.default_rng(seed)
  hidden = (rng.normal(size=(B, T, D)) * 2).astype(dtype)
  head = (rng.normal(size=(D, V)) * 2).astype(dtype)
  targets = rng.integers(0, V, size=(B, T))
  return hidden, head, targets


@pytest.mark.parametrize("chunk,temperature", [(3, 1.0), (7, 1.0), (64, 0.7)])
def test_matches_full_log_softmax(chunk, temperature):
  hidden, head, targets = make(0)
  f = jit(lambda h, w, t: (
      lp_lib.token_logprobs_and_entropy(h, w, t, chunk=chunk, temperature=temperature),
      lp_lib.logprobs_from_logits(h @ w / temperature, t),
      lp_lib.entropy_from_logits(h @ w / temperature)))
  (logp, entropy), full_logp, full_entropy = f(hidden, head, targets)
  assert logp.dtype == entropy.dtype == jnp.float32
  assert logp.shape == entropy.shape == (B, T)
  expected_logp, expected_entropy = np_logprobs_entropy(hidden, head, targets, temperature)
  np.testing.assert_allclose(np.asarray(logp), expected_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(entropy), expected_entropy, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(full_logp), expected_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(full_entropy), expected_entropy, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_give_float32_outputs():
  hidden, head, targets = make(1)
  logp, entropy = jit(lambda h, w, t: lp_lib.token_logprobs_and_entropy(h, w, t, chunk=4))(
      jnp.asarray(hidden, jnp.bfloat16), jnp.asarray(head, jnp.bfloat16), targets)
  assert logp.dtype == entropy.dtype == jnp.float32
  expected_logp, _ = np_logprobs_entropy(np.asarray(jnp.asarray(hidden, jnp.bfloat16), np.float32),
                                         np.asarray(jnp.asarray(head, jnp.bfloat16), np.float32),
                                         targets)
  np.testing.assert_allclose(np.asarray(logp), expected_logp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("temperature,softcap", [(1.0, None), (0.7, 3.0)])
def test_gradient_matches_full_logits(x64, temperature, softcap):
  """Gradients w.r.t. hidden and head (the chunks' own backward) equal JAX's autodiff through
  the full [B, T, V] logits, soft cap and temperature included."""
  hidden, head, targets = make(2, np.float64)
  weights = np.random.default_rng(2).normal(size=(2, B, T))

  def chunked(h, w):
    logp, entropy = lp_lib.token_logprobs_and_entropy(h, w, targets, chunk=3,
                                                      temperature=temperature, softcap=softcap)
    return (weights[0] * logp + weights[1] * entropy).sum()

  def full(h, w):
    logits = h @ w
    if softcap is not None:
      logits = jnp.tanh(logits / softcap) * softcap
    logits = logits / temperature
    logp = jax.nn.log_softmax(logits)
    ent = -(jnp.exp(logp) * logp).sum(-1)
    tok = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return (weights[0] * tok + weights[1] * ent).sum()

  g_chunked, g_full = jit(lambda h, w: (jax.grad(chunked, argnums=(0, 1))(h, w),
                                        jax.grad(full, argnums=(0, 1))(h, w)))(hidden, head)
  for a, b in zip(g_chunked, g_full):
    assert a.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_peak_memory_stays_far_below_full_logits():
  """8 x 1024 tokens, vocab 152064: neither forward nor backward holds [B, T, V] float32."""
  batch, length, dim, vocab, chunk = 8, 1024, 64, 152064, 32
  full_logits = batch * length * vocab * 4
  chunk_logits = batch * chunk * vocab * 4
  spec = (jax.ShapeDtypeStruct((batch, length, dim), jnp.float32),
          jax.ShapeDtypeStruct((dim, vocab), jnp.float32),
          jax.ShapeDtypeStruct((batch, length), jnp.int32))

  def forward(h, w, t):
    return lp_lib.token_logprobs_and_entropy(h, w, t, chunk=chunk)

  def loss(h, w, t):
    logp, entropy = forward(h, w, t)
    return (logp + 0.01 * entropy).sum()

  for fn in (forward, jax.grad(loss, argnums=(0, 1))):
    temp = jax.jit(fn).lower(*spec).compile().memory_analysis().temp_size_in_bytes
    assert temp < full_logits / 4, (fn, temp / full_logits)
    assert temp <= 6 * chunk_logits, (fn, temp / chunk_logits)  # a few chunks, whatever T is


def test_shape_errors():
  hidden, head, targets = make(3)
  with pytest.raises(ValueError, match="hidden size"):
    lp_lib.token_logprobs_and_entropy(hidden, head[:3], targets, chunk=2)
  with pytest.raises(ValueError, match="chunk"):
    lp_lib.token_logprobs_and_entropy(hidden, head, targets, chunk=0)


def test_bfloat16_backward_runs_its_matmuls_in_bfloat16():
  """With bfloat16 hidden states and head, every matmul over the vocabulary, the backward's
  included, takes bfloat16 operands (float32 accumulation): a float32 cotangent would make the
  two backward matmuls float32 (TF32 on a GPU). The gradients still equal float32 arithmetic on
  the same rounded inputs within bfloat16's rounding of the cotangent (8 significant bits)."""
  hidden, head, targets = make(4)
  h16, w16 = jnp.asarray(hidden, jnp.bfloat16), jnp.asarray(head, jnp.bfloat16)

  def loss(h, w):
    logp, entropy = lp_lib.token_logprobs_and_entropy(h, w, targets, chunk=4)
    return (logp + 0.1 * entropy).sum()

  grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
  text = grad.lower(h16, w16).as_text()
  dots = [line for line in text.splitlines() if "dot_general" in line]
  assert len(dots) >= 3, text  # forward (twice: rematerialised) and the two backward products
  for line in dots:
    operands = line.split(":")[-1].split("->")[0]
    assert operands.count("bf16") == 2 and "f32" not in operands, line
  g16 = grad(h16, w16)
  g32 = jax.grad(loss, argnums=(0, 1))(*(np.asarray(x, np.float32) for x in (h16, w16)))
  for a, b in zip(g16, g32):
    assert a.dtype == jnp.bfloat16
    scale = np.abs(np.asarray(b)).max()
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b), atol=2 ** -7 * scale)

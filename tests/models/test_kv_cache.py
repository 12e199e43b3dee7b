"""Prefill of left-padded prompts + step-by-step cached decode equals the full forward."""
import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import ModelConfig, transformer


def _cached_logits(cfg, params, prompt, prompt_mask, continuation):
  """Prefill the prompt, then feed the continuation one token at a time through the cache."""
  b, p = prompt.shape
  steps = continuation.shape[1]
  cache = transformer.init_cache(cfg, b, p + steps)
  kv_mask = jnp.concatenate([prompt_mask, jnp.zeros((b, steps), prompt_mask.dtype)], axis=1)
  positions = transformer.positions_from_mask(prompt_mask)
  hidden, cache = transformer.cached_step(cfg, params, prompt, positions, cache, 0, kv_mask)
  out = [transformer.bind(cfg, params).logits(hidden)]
  next_pos = positions[:, -1] + 1
  for t in range(steps):
    kv_mask = kv_mask.at[:, p + t].set(1)
    hidden, cache = transformer.cached_step(cfg, params, continuation[:, t:t + 1], next_pos[:, None],
                                      cache, p + t, kv_mask)
    out.append(transformer.bind(cfg, params).logits(hidden))
    next_pos = next_pos + 1
  return jnp.concatenate(out, axis=1)


def test_prefill_and_decode_equal_full_forward():
  cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, model_type="qwen2")
  params = transformer.init_params(cfg, seed=3)
  rng = np.random.default_rng(0)
  lengths = [6, 2, 4]
  p, steps = 6, 5
  prompt = np.zeros((3, p), np.int32)
  mask = np.zeros_like(prompt)
  for i, n in enumerate(lengths):
    prompt[i, p - n:] = rng.integers(1, 50, n)
    mask[i, p - n:] = 1
  continuation = rng.integers(1, 50, (3, steps)).astype(np.int32)
  cached = np.asarray(jax.jit(_cached_logits, static_argnums=0)(cfg, params, prompt, mask,
                                                                 continuation))
  full_tokens = np.concatenate([prompt, continuation], 1)
  full_mask = np.concatenate([mask, np.ones_like(continuation)], 1)
  full = np.asarray(transformer.logits(cfg, params, full_tokens, full_mask))
  valid = full_mask.astype(bool)
  assert np.abs(cached - full)[valid].max() <= 1e-5

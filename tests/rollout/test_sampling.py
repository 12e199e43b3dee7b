"""Sampling transforms, sampled frequencies, stopping and padding, randomness, host helpers."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rljax.models import ModelConfig, transformer
from rljax.rollout import (SamplingParams, generate_text, left_pad, pick_tokens, process_logits,
                           sample)

V = 16
# Fixed logits with a tie (indices 3 and 4) and a long tail.
LOGITS = np.array([2.0, 1.5, 1.2, 1.0, 1.0, 0.5, 0.2, 0.0, -0.3, -0.5, -1.0, -1.5, -2.0, -2.5,
                   -3.0, -4.0], np.float32)
STOP = 6


def _reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
  """The processed distribution in float64 numpy (same order: temperature, top-k, top-p, min-p)."""
  x = np.asarray(logits, np.float64) / temperature
  keep = np.ones_like(x, bool)
  if top_k:
    keep &= x >= np.sort(x)[::-1][top_k - 1]
  if top_p < 1.0:
    p = np.where(keep, np.exp(x - x.max()), 0.0)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    kept = order[before < top_p]
    keep &= x >= x[kept].min()
  if min_p > 0.0:
    p = np.where(keep, np.exp(x - x.max()), 0.0)
    keep &= p >= min_p * p.max()
  p = np.where(keep, np.exp(x - x.max()), 0.0)
  return p / p.sum()


CASES = {
    "temperature": dict(temperature=0.6),
    "top_k": dict(top_k=4),  # the tie at the 4th value keeps 5 tokens
    "top_p": dict(top_p=0.7, temperature=1.3),
    "min_p": dict(min_p=0.2),
    "all": dict(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_process_logits_matches_reference(case):
  sp = SamplingParams(**CASES[case])
  rng = np.random.default_rng(0)
  rows = np.stack([LOGITS, LOGITS[::-1], rng.normal(size=V).astype(np.float32) * 3])
  got = np.asarray(jax.nn.softmax(process_logits(jnp.asarray(rows), sp), -1))
  want = np.stack([_reference_probs(r, **CASES[case]) for r in rows])
  np.testing.assert_allclose(got, want, atol=1e-6)
  if case == "top_k":
    assert (got[0] > 0).sum() == 5


def test_pick_tokens_greedy_and_logps():
  logits = jnp.asarray(np.stack([LOGITS, LOGITS[::-1]]))
  tok, logp, slogp = pick_tokens(logits, jax.random.key(0), SamplingParams(greedy=True))
  np.testing.assert_array_equal(tok, [0, V - 1])
  np.testing.assert_allclose(logp, jax.nn.log_softmax(logits)[:, 0][:1].tolist() * 2, atol=1e-6)
  np.testing.assert_array_equal(slogp, 0.0)
  assert SamplingParams(temperature=0.0).is_greedy


def controlled_model(logits):
  """A 1-layer model whose next-token logits are ``logits`` whatever the input.

  Every block's output projections are zero, so the residual stream stays the token embedding
  ``e_0`` for every token; the final RMSNorm makes it ``sqrt(D) e_0`` and row 0 of the head holds
  the logits.
  """
  d = V
  cfg = ModelConfig(vocab_size=V, hidden_size=d, intermediate_size=16, num_layers=1, num_heads=2,
                    num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6)
  params = jax.tree.map(np.zeros_like, jax.device_get(transformer.init_params(cfg, 0)))
  params["layers_0"]["input_layernorm"]["scale"][:] = 1
  params["layers_0"]["post_attention_layernorm"]["scale"][:] = 1
  params["norm"]["scale"][:] = 1
  params["embed_tokens"][:, 0] = 1.0
  params["lm_head"]["kernel"][0] = np.asarray(logits, np.float64) * np.sqrt(1 / d + 1e-6)
  return cfg, params


@pytest.fixture(scope="module")
def fixed():
  return controlled_model(LOGITS)


def _prompts(n, p=4, seed=0):
  tokens = np.random.default_rng(seed).integers(0, V, (n, p)).astype(np.int32)
  mask = np.ones_like(tokens)
  mask[::2, :2] = 0  # left padding in every other prompt
  return tokens, mask


def _chi_square_pvalue(samples, probs):
  counts = np.bincount(np.ravel(samples), minlength=V)
  assert counts[probs == 0].sum() == 0  # nothing outside the support
  support = probs > 0
  return stats.chisquare(counts[support], counts.sum() * probs[support]).pvalue


@pytest.mark.parametrize("case", ["temperature", "top_k", "top_p", "min_p"])
def test_pick_tokens_frequencies_match_processed_distribution(case):
  """20000 draws from fixed logits: chi-square against the processed distribution."""
  sp = SamplingParams(**CASES[case])
  logits = jnp.broadcast_to(jnp.asarray(LOGITS), (20000, V))
  tok, logp, slogp = jax.jit(pick_tokens, static_argnums=2)(logits, jax.random.key(1), sp)
  probs = _reference_probs(LOGITS, **CASES[case])
  assert _chi_square_pvalue(tok, probs) > 1e-3
  np.testing.assert_allclose(slogp, np.log(probs[np.asarray(tok)]), atol=1e-5)
  np.testing.assert_allclose(logp, np.log(_reference_probs(LOGITS))[np.asarray(tok)], atol=1e-5)


def test_sampler_frequencies_match_processed_distribution(fixed):
  """End to end: 2048 rows x 4 steps through prefill, decode loop and group sampling."""
  cfg, params = fixed
  sp = SamplingParams(max_new_tokens=4, **CASES["all"])
  tokens, mask = _prompts(16)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(42), sp, group_size=128))
  assert r.tokens.shape == (2048, 4) and r.mask.all() and r.truncated.all()
  probs = _reference_probs(LOGITS, **CASES["all"])
  assert _chi_square_pvalue(r.tokens, probs) > 1e-3
  # Reported log-probs: policy = raw logits, sampler = processed distribution.
  np.testing.assert_allclose(r.sampler_logp, np.log(_reference_probs(LOGITS))[r.tokens], atol=1e-5)
  np.testing.assert_allclose(r.draw_logp, np.log(probs[r.tokens]), atol=1e-5)


# One compilation shared by the tests below: same config, SamplingParams and shapes.
SHARED_SP = SamplingParams(max_new_tokens=12, stop_ids=(STOP,), pad_id=0)
SHARED_G = 16


def _shared_sample(params, key, prompts=None):
  cfg, _ = controlled_model(LOGITS)
  tokens, mask = _prompts(4, p=8) if prompts is None else prompts
  return jax.device_get(sample(cfg, params, tokens, mask, key, SHARED_SP, group_size=SHARED_G))


def test_stop_tokens_end_rows_with_padding():
  _, params = controlled_model(LOGITS + np.eye(V)[STOP] * 1.2)  # stop w.p. ~0.15 per step
  r = _shared_sample(params, jax.random.key(3))
  assert_rows_stop_and_pad(r, STOP, 12)


def assert_rows_stop_and_pad(r, stop, t):
  """Each row ends at its first ``stop`` token (kept) or is truncated at ``t`` and flagged; after
  the end: pad 0 tokens, mask 0, zero log-probs; before: negative policy log-probs."""
  is_stop = r.tokens == stop
  hit = is_stop.any(1)
  assert hit.any() and (~hit).any()
  first = np.where(hit, np.argmax(is_stop, 1) + 1, t)
  np.testing.assert_array_equal(r.lengths, first)
  np.testing.assert_array_equal(r.mask, np.arange(t)[None] < first[:, None])
  np.testing.assert_array_equal(r.truncated, ~hit)
  after = r.mask == 0
  assert after.any() and (r.tokens[after] == 0).all()
  assert (r.sampler_logp[after] == 0).all() and (r.draw_logp[after] == 0).all()
  assert (r.sampler_logp[~after] < 0).all()
  assert (is_stop & ~after).sum(1).max() == 1  # exactly one stop token, the last valid one


def test_every_row_stopped_exits_early_with_padding():
  _, params = controlled_model(np.eye(V)[STOP] * 50.0)  # always the stop token
  r = _shared_sample(params, jax.random.key(0))
  np.testing.assert_array_equal(r.lengths, 1)
  assert (r.tokens[:, 0] == STOP).all() and (r.tokens[:, 1:] == 0).all()
  assert not r.truncated.any() and r.mask.sum() == r.tokens.shape[0]


def test_randomness_reproducible_and_per_row():
  cfg, _ = controlled_model(LOGITS)
  params = jax.device_get(transformer.init_params(cfg, 1))  # a random model, the shared config
  params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 100  # spread-out logits
  a = _shared_sample(params, jax.random.key(5))
  b = _shared_sample(params, jax.random.key(5))
  c = _shared_sample(params, jax.random.key(6))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert (a.tokens != c.tokens).any()
  assert len({tuple(row) for row in a.tokens[:SHARED_G]}) > SHARED_G // 2  # group members differ
  np.testing.assert_array_equal(a.prompt_tokens, np.repeat(_prompts(4, p=8)[0], SHARED_G, 0))


def test_left_pad_buckets_to_a_multiple():
  tokens, mask = left_pad([[5, 6, 7], [8], [1, 2, 3, 4, 5, 6, 7, 8, 9]], bucket=4, pad_id=0)
  assert tokens.shape == (3, 12) and tokens.dtype == np.int32
  np.testing.assert_array_equal(tokens[0, -3:], [5, 6, 7])
  np.testing.assert_array_equal(mask.sum(1), [3, 1, 9])
  assert (tokens[mask == 0] == 0).all() and mask[:, -1].all()
  assert left_pad([[1] * 8], bucket=8, pad_id=0)[0].shape == (1, 8)
  with pytest.raises(ValueError, match="empty"):
    left_pad([[1], []], bucket=4, pad_id=0)


class _Tok:
  eos_id, pad_id = STOP, 0

  def encode(self, text):
    return [1 + (ord(c) % 5) for c in text]

  def decode(self, ids):
    return "".join("abcdefghijklmnop"[i] for i in ids)


def test_generate_text_decodes_completions_without_stop_token():
  cfg, params = controlled_model(LOGITS + np.eye(V)[STOP] * 1.2)
  sp = SamplingParams(max_new_tokens=12)  # + eos_id and pad_id of the tokenizer = SHARED_SP
  r, texts = generate_text(cfg, params, _Tok(), ["hi", "there", "x", "abcdefg"],
                           jax.random.key(0), sp, group_size=SHARED_G, bucket=8)
  r = jax.device_get(r)
  assert len(texts) == 4 * SHARED_G and r.prompt_tokens.shape == (4 * SHARED_G, 8)
  assert r.truncated.any() and not r.truncated.all()
  for n, trunc, text in zip(r.lengths, r.truncated, texts):
    assert len(text) == n - (0 if trunc else 1)
    assert "g" not in text  # STOP = 6 -> 'g' never appears in a decoded completion


_SHARDED = r"""
import jax, numpy as np
from jax.sharding import Mesh
from rljax.models import ModelConfig, transformer
from rljax.rollout import SamplingParams, make_sampler, sample
assert jax.device_count() == 4
cfg = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                  num_heads=2, num_kv_heads=1, head_dim=8)
params = transformer.init_params(cfg, 0)
tokens = np.random.default_rng(0).integers(1, 32, (4, 6)).astype(np.int32)
mask = np.ones_like(tokens); mask[1, :3] = 0
sp = SamplingParams(max_new_tokens=8, temperature=0.9, top_k=10, stop_ids=(3,))
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
fn = make_sampler(cfg, sp, group_size=2, mesh=mesh, data_axis=("data", "fsdp"))
got = fn(params, tokens, mask, jax.random.key(1))
assert got.tokens.sharding.spec[0] == ("data", "fsdp"), got.tokens.sharding
assert {s.data.shape for s in got.tokens.addressable_shards} == {(2, 8)}
try:
  fn(params, tokens[:3], mask[:3], jax.random.key(1))
  raise AssertionError("3 prompts on 4 shards must fail")
except ValueError as e:
  assert "split evenly" in str(e)
want = sample(cfg, params, tokens, mask, jax.random.key(1), sp, group_size=2)
np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
np.testing.assert_allclose(np.asarray(got.sampler_logp), np.asarray(want.sampler_logp), atol=1e-5)
np.testing.assert_array_equal(np.asarray(got.truncated), np.asarray(want.truncated))
# Continuous batching per shard (2 rows, 1 slot each): the same rollout.
cont = make_sampler(cfg, sp, group_size=2, mesh=mesh, data_axis=("data", "fsdp"),
                    max_concurrent_rows=1)(params, tokens, mask, jax.random.key(1))
np.testing.assert_array_equal(np.asarray(cont.tokens), np.asarray(want.tokens))
np.testing.assert_array_equal(np.asarray(cont.truncated), np.asarray(want.truncated))
np.testing.assert_allclose(np.asarray(cont.sampler_logp), np.asarray(want.sampler_logp), atol=1e-5)
print("OK")
"""


def test_make_sampler_shards_the_batch_on_data():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_fused_gumbel_noise_is_jax_random_gumbel():
  from rljax.rollout import noise
  for key in (jax.random.key(3), jax.random.PRNGKey(11)):
    full = np.asarray(jax.random.gumbel(key, (6, 10)))
    got = jax.jit(noise.gumbel, static_argnums=1)(key, (6, 10))
    np.testing.assert_array_equal(np.asarray(got), full)
    part = jax.jit(noise.gumbel, static_argnums=1)(key, (2, 10), 40)  # rows 4..5
    np.testing.assert_array_equal(np.asarray(part), full[4:])


def test_chunked_decoding_equals_the_whole_batch(monkeypatch):
  """Decoding the rows in sequential chunks (CPU cache blocking) changes nothing."""
  import functools
  from rljax.rollout import decode, sampler
  cfg, _ = controlled_model(LOGITS)
  params = jax.device_get(transformer.init_params(cfg, 2))  # a random model: the cache matters
  params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 30
  tokens, mask = _prompts(4, p=8)
  sp = SamplingParams(max_new_tokens=12, stop_ids=(STOP, 3, 11), temperature=1.5, top_p=0.95)
  run = lambda: jax.device_get(jax.jit(functools.partial(
      sampler._sample_impl, cfg=cfg, sp=sp, group_size=3))(params, tokens, mask,
                                                            jax.random.key(9)))
  monkeypatch.setattr(decode, "CPU_TUNED_BACKENDS", (jax.default_backend(),))
  monkeypatch.setattr(sampler, "CPU_CHUNK_BYTES", 1 << 40)
  assert sampler.prompts_per_chunk(cfg, 4, 8, 3, 12) == 4
  whole = run()
  per_row = sampler._cache_bytes_per_row(cfg, 8 + 12)
  monkeypatch.setattr(sampler, "CPU_CHUNK_BYTES", 6 * per_row)  # 2 prompts x 3 rows per chunk
  assert sampler.prompts_per_chunk(cfg, 4, 8, 3, 12) == 2
  chunked = run()
  for x, y in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked)):
    np.testing.assert_allclose(x, y, atol=1e-6)
  assert whole.truncated.any() and not whole.truncated.all()


def test_unfused_projections_equal_the_fused_ones(monkeypatch):
  """q/k/v and gate/up as separate matmuls (CPU, large kernels) sample what the fused ones do."""
  import functools
  from rljax.rollout import decode, sampler
  cfg = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, mlp_bias=True,
                    max_position_embeddings=64)
  params = jax.device_get(transformer.init_params(cfg, 4))
  tokens, mask = _prompts(4, p=8)
  sp = SamplingParams(max_new_tokens=10, stop_ids=(5,), temperature=1.3)
  run = lambda: jax.device_get(jax.jit(functools.partial(
      sampler._sample_impl, cfg=cfg, sp=sp, group_size=2))(params, tokens, mask,
                                                            jax.random.key(3)))
  monkeypatch.setattr(decode, "CPU_TUNED_BACKENDS", (jax.default_backend(),))
  fused = run()
  fused_cfg, w = decode.inference_params(cfg, params)
  w = w["layers_0"]
  assert fused_cfg.fused_qkv and fused_cfg.fused_mlp
  assert set(w["self_attn"]["qkv_proj"]) == {"kernel", "bias"} and "gate_up_proj" in w["mlp"]
  # Below the fused kernels' size (8 KiB for q/k/v) but above their biases' (256 bytes): kernels
  # and biases must be kept apart together.
  monkeypatch.setattr(decode, "CPU_MAX_FUSED_KERNEL_BYTES", 1 << 10)
  apart_cfg, w = decode.inference_params(cfg, params)
  w = w["layers_0"]
  assert not apart_cfg.fused_qkv and not apart_cfg.fused_mlp
  assert {"q_proj", "k_proj", "v_proj"} <= set(w["self_attn"]) and "gate_proj" in w["mlp"]
  apart = run()
  for x, y in zip(jax.tree.leaves(fused), jax.tree.leaves(apart)):
    np.testing.assert_allclose(x, y, atol=1e-5)
  assert fused.mask.sum() > 8

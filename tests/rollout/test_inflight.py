"""In-flight weight updates (``rljax.rollout.inflight``): every token of a chunked rollout is
drawn by the weights published before its chunk, and its sampler log-prob is that of those
weights given the whole prefix (checked against a teacher-forced forward of each weight set);
stops, padding and per-token versions."""
import jax
import numpy as np
import pytest

from rljax.models import ModelConfig, transformer
from rljax.rollout import SamplingParams, left_pad, sample
from rljax.rollout.inflight import sample_inflight
from tests.rollout.test_sampling import assert_rows_stop_and_pad

V, STOP, T, CHUNK, G = 16, 3, 12, 4, 4
CFG = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16, max_position_embeddings=64)
SP = SamplingParams(temperature=1.0, max_new_tokens=T, stop_ids=(STOP,), pad_id=0)
VERSIONS = (5, 6, 9)  # the learner steps of the weights read before chunks 0, 1, 2


def _weights(seed):
  # Larger than the initialisation's std 0.02, so that the three policies differ visibly.
  return jax.tree.map(lambda x: 8 * x, transformer.init_params(CFG, seed=seed))


def _sample(params, tokens, mask, key, sampling, group_size):
  return jax.tree.map(np.asarray, sample(CFG, params, tokens, mask, key, sampling, group_size))


def _teacher_forced(params, r):
  """(log p(token t | prompt, tokens < t) of every completion token under ``params``, the
  largest |logit|)."""
  seq = np.concatenate([r.prompt_tokens, r.tokens], 1)
  valid = np.concatenate([r.prompt_mask, r.mask], 1)
  logits = np.asarray(transformer.logits(CFG, params, seq, valid), np.float64)
  logits = logits[:, r.prompt_tokens.shape[1] - 1:-1]
  logp = np.asarray(jax.nn.log_softmax(logits, -1))
  return np.take_along_axis(logp, r.tokens[..., None], -1)[..., 0], np.abs(logits).max()


@pytest.fixture(scope="module")
def inflight():
  weights = [_weights(s) for s in range(3)]
  reads = iter(zip(VERSIONS, weights))
  tokens, mask = left_pad([[1, 5, 7], [2, 9], [4, 4, 8, 6], [11]], 4, 0)
  r = sample_inflight(_sample, lambda: next(reads), tokens, mask, jax.random.key(0), SP, G, CHUNK)
  return r, weights


def test_each_token_is_drawn_by_the_weights_of_its_chunk(inflight):
  r, weights = inflight
  version = r.extras["token_version"]
  chunk_of = np.arange(T) // CHUNK
  for c, (v, params) in enumerate(zip(VERSIONS, weights)):
    here = (r.mask > 0) & (chunk_of[None] == c)
    assert here.any(), c  # some rows reach every chunk: the comparison is not vacuous
    assert (version[here] == v).all()
    got = r.sampler_logp[here]
    want, largest = _teacher_forced(params, r)
    # The sampler (KV cache) and the full forward round float32 logits of size `largest`
    # differently: tens of ulps of the largest logit (~3e-6 x largest seen), so a few hundred
    # ulps of margin for other CPUs and summation orders.
    atol = 3e-5 * largest
    np.testing.assert_allclose(got, want[here], atol=atol)
    other = weights[(c + 1) % 3]  # the other weights would give other log-probs
    assert np.abs(_teacher_forced(other, r)[0][here] - got).max() > 10 * atol


def test_stops_padding_and_versions(inflight):
  r, _ = inflight
  assert_rows_stop_and_pad(r, STOP, T)  # the same rules as one sampler call
  pad = r.mask == 0
  assert (r.extras["token_version"][pad] == -1).all()
  assert (r.extras["token_version"][~pad] >= 0).all()
  assert r.prompt_tokens.shape == (4 * G, 4) and r.tokens.shape == (4 * G, T)


def test_all_rows_stopped_ends_the_rollout_early():
  """Every token id stops: each row ends at its first token, and no second chunk is asked for."""
  calls = []

  def newest():
    calls.append(1)
    return 0, _weights(0)

  r = sample_inflight(_sample, newest, *left_pad([[1, 2]], 2, 0), jax.random.key(1),
                      SamplingParams(greedy=True, max_new_tokens=T, stop_ids=tuple(range(V)),
                                     pad_id=0), 2, CHUNK)
  assert len(calls) == 1  # every row stopped in chunk 0: no second call
  np.testing.assert_array_equal(r.lengths, 1)
  assert r.tokens.shape == (2, T) and (r.extras["token_version"][:, 1:] == -1).all()

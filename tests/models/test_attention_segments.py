"""Packed rows: several sequences per row, told apart by segment ids (``rljax.models.attention``'s
module doc). Every CPU attention backend against float64 NumPy attention of each sequence on its
own (forward, gradient, sliding window, queries at an offset), hand-worked segment spans and
positions, and the packed forward (and one gradient) of a tiny model of each family against the
forwards of its sequences one per row."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import attention as attn
from rljax.models import transformer
from tests import hf_models

B, T, H, G, DH = 3, 100, 4, 2, 8
BLOCK = 16  # blockwise: 7 x 7 blocks of 15 (balanced)
WINDOW = 7
# (segment, first slot, end slot) per row; padding between and after segments, and before.
LAYOUT = [[(1, 0, 30), (2, 30, 65), (3, 70, 95)],
          [(1, 2, 34), (2, 34, 72), (3, 72, 100)],
          [(1, 0, 45), (2, 45, 100)]]


def _segments():
  seg = np.zeros((B, T), np.int32)
  for row, runs in enumerate(LAYOUT):
    for sid, lo, hi in runs:
      seg[row, lo:hi] = sid
  return seg


def _numpy_alone(q, k, v, window=None):
  """float64 causal attention of one sequence alone: q [S, H, Dh], k, v [S, G, Dh]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  s, h, dh = q.shape
  k, v = np.repeat(k, h // k.shape[1], axis=1), np.repeat(v, h // v.shape[1], axis=1)
  scores = np.einsum("shd,khd->hsk", q, k) / np.sqrt(dh)
  i = np.arange(s)
  ok = i[None, :] <= i[:, None]
  if window is not None:
    ok &= i[:, None] - i[None, :] < window
  scores = np.where(ok, scores, -np.inf)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  return np.einsum("hsk,khd->shd", p / p.sum(-1, keepdims=True), v)


def _numpy_packed(q, k, v, window=None):
  """Each segment of LAYOUT attended alone, written back at its slots (0 on padding)."""
  out = np.zeros(q.shape, np.float64)
  for row, runs in enumerate(LAYOUT):
    for _, lo, hi in runs:
      out[row, lo:hi] = _numpy_alone(q[row, lo:hi], k[row, lo:hi], v[row, lo:hi], window)
  return out


@pytest.fixture(scope="module")
def inputs():
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (B, T, H, DH))
  k = jax.random.normal(ks[1], (B, T, G, DH))
  v = jax.random.normal(ks[2], (B, T, G, DH))
  seg = _segments()
  cotangent = jax.random.normal(ks[3], (B, T, H, DH)) * (seg > 0)[:, :, None, None]
  return q, k, v, jnp.asarray(seg), cotangent


BACKENDS = {
    "xla": lambda q, k, v, s, w: attn.reference_attention(q, k, v, s, window=w),
    "blockwise": lambda q, k, v, s, w: attn.blockwise_attention(q, k, v, s, window=w, block=BLOCK),
    # cuDNN's entry point with XLA's implementation of its masking (cuDNN needs a GPU): packed
    # rows take the blockwise fallback.
    "cudnn_fallback": lambda q, k, v, s, w: attn.cudnn_attention(q, k, v, s, window=w,
                                                                 implementation="xla", block=BLOCK),
    # Pallas splash attention in interpret mode (the TPU kernel, run on CPU), segment ids native.
    "pallas_interpret": lambda q, k, v, s, w: attn.splash_attention(q, k, v, s, window=w,
                                                                    interpret=True),
}


@functools.lru_cache(maxsize=None)
def _value_and_grad(name, window):
  def loss(q, k, v, seg, ct):
    out = BACKENDS[name](q, k, v, seg, window)
    return (out * ct).sum(), out
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


# The windowed case for the kernels that only re-use blockwise's code (cuDNN's fallback) or that
# cost most to run (splash interpreted).
@pytest.mark.parametrize("name, window", [("xla", None), ("xla", WINDOW), ("blockwise", None),
                                          ("blockwise", WINDOW), ("cudnn_fallback", WINDOW),
                                          ("pallas_interpret", WINDOW)])
def test_packed_rows_match_each_sequence_alone(name, window, inputs):
  """Forward against NumPy attention of each sequence alone; gradients against the materialised
  reference's (itself checked against NumPy's forward here and central differences below)."""
  q, k, v, seg, ct = inputs
  (_, out), grads = _value_and_grad(name, window)(q, k, v, seg, ct)
  valid = np.asarray(seg) > 0
  exact = _numpy_packed(np.asarray(q), np.asarray(k), np.asarray(v), window)
  assert np.abs(np.asarray(out) - exact)[valid].max() <= 1e-5
  # Attending across segments (one segment per row) is far off: the layout matters.
  crossing = np.asarray(attn.reference_attention(q, k, v, valid, window=window))
  assert np.abs(crossing - exact)[valid].max() > 1e-2
  if name != "xla":
    _, ref_grads = _value_and_grad("xla", window)(q, k, v, seg, ct)
    for got, want in zip(grads, ref_grads):
      scale = np.abs(np.asarray(want)).max()
      assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-5 * max(scale, 1.0)


def test_reference_gradient_matches_central_differences(inputs):
  """d/dk and d/dq of the packed reference (and so of every backend above) against float64
  central differences of the per-sequence NumPy formula: a key near a segment boundary feeds
  only its own segment's queries."""
  q, k, v, seg, ct = inputs
  _, (dq, dk, _) = _value_and_grad("xla", WINDOW)(q, k, v, seg, ct)
  qn, kn, vn, ctn = (np.asarray(x, np.float64) for x in (q, k, v, ct))
  eps = 1e-4
  for which, grad, idx in [("k", dk, (0, 29, 1, 3)), ("k", dk, (1, 34, 0, 5)),
                           ("q", dq, (2, 45, 2, 1)), ("q", dq, (0, 72, 3, 0))]:
    f = lambda x: (_numpy_packed(x, kn, vn, WINDOW) if which == "q"
                   else _numpy_packed(qn, x, vn, WINDOW)) * ctn
    base = qn if which == "q" else kn
    up, down = base.copy(), base.copy()
    up[idx] += eps
    down[idx] -= eps
    assert abs((f(up).sum() - f(down).sum()) / (2 * eps) - float(grad[idx])) <= 1e-4


def test_queries_at_an_offset_see_their_segment(inputs):
  """Decode-like queries (traced slot offset) against the whole row, segments and window."""
  q, k, v, seg, _ = inputs
  offset = 60  # slots 60..67: row 0 crosses padding into segment 3, row 2 sits in segment 2
  qq = q[:, offset:offset + 8]
  exact = _numpy_packed(np.asarray(q), np.asarray(k), np.asarray(v), 20)[:, offset:offset + 8]
  valid = np.asarray(seg)[:, offset:offset + 8] > 0
  for fn in (attn.attention, attn.blockwise_attention):
    run = jax.jit(lambda o, fn=fn: fn(qq, k, v, seg, q_offset=o, window=20, block=4))
    assert np.abs(np.asarray(run(jnp.int32(offset))) - exact)[valid].max() <= 1e-5


def test_segment_spans_positions_and_queries_hand_worked():
  """Row 0: pad, segment 1 (3 tokens), pad, segment 2 (2 tokens), pad. Row 1: a 0/1 mask, one
  segment: positions ``cumsum(mask) - 1`` floored at 0 (the left-padded rows' positions)."""
  rows = jnp.asarray([[0, 1, 1, 1, 0, 2, 2, 0], [0, 0, 1, 1, 1, 0, 0, 0]])

  @jax.jit
  def everything(seg):
    return (attn.segment_spans(seg), attn.query_segments(seg, 0, 8),
            transformer.positions_from_mask(seg), attn.first_valid(seg),
            attn.several_segments(seg), attn.several_segments(seg[1:]))
  (start, end), qseg, pos, first, several, one = jax.tree.map(np.asarray, everything(rows))
  assert start.tolist() == [[0, 1, 1, 1, 1, 5, 5, 5], [0, 1, 2, 2, 2, 2, 2, 2]]
  assert end.tolist() == [[0, 4, 4, 4, 4, 7, 7, 7], [1, 1, 7, 7, 7, 7, 7, 7]]
  assert qseg.tolist() == [[0, 1, 1, 1, 1, 2, 2, 2], [0, 0, 1, 1, 1, 1, 1, 1]]
  assert pos.tolist() == [[0, 0, 1, 2, 2, 0, 1, 1], [0, 0, 0, 1, 2, 2, 2, 2]]
  assert first.tolist() == [1, 2]
  assert bool(several) and not bool(one)


# --- packed forwards of tiny models against their sequences one per row ---------------------------

LENGTHS = [7, 5, 9, 4, 6]
# (sequence index, first slot) per packed row of 16 slots; padding between and after; the last
# two rows empty, so the packed batch has the shape of the one-sequence-per-row batch (one
# compilation serves both).
PACKING = [[(0, 0), (1, 7)], [(2, 0), (3, 10)], [(4, 3)], [], []]
WIDTH = 16


def _batches():
  """The sequences one per row (left-padded, a 0/1 mask) and packed into rows (segment ids)."""
  tokens, mask = hf_models.left_padded(LENGTHS, width=WIDTH, vocab=hf_models.VOCAB, seed=4)
  packed = np.zeros_like(tokens)
  seg = np.zeros_like(tokens)
  where = {}
  for row, runs in enumerate(PACKING):
    for sid, (i, lo) in enumerate(runs, start=1):
      n = LENGTHS[i]
      packed[row, lo:lo + n] = tokens[i, -n:]
      seg[row, lo:lo + n] = sid
      where[i] = (row, lo)
  return tokens, mask, packed, seg, where


def _family_config(name):
  """The tiny ``transformers`` config of ``name`` as an rljax config, random weights large
  enough (x8) that attention is far from uniform."""
  cfg = models.ModelConfig.from_hf_dict(hf_models.hf_config(name).to_dict())
  params = jax.tree.map(lambda w: w * 8.0, transformer.init_params(cfg, seed=1))
  return cfg, params


def _log_probs(cfg, params, hidden):
  return np.asarray(jax.nn.log_softmax(transformer.bind(cfg, params).logits(hidden), -1))


@pytest.mark.parametrize("family, backend", [("llama", "cudnn"),
                                             ("qwen3", "blockwise"), ("gemma3", "blockwise"),
                                             ("qwen3_moe", "blockwise")])
def test_packed_forward_equals_each_sequence_alone(family, backend, monkeypatch):
  """Hidden states, log-probs (and the MoE layer's routes and load-balancing loss) of packed
  rows against the forward of the same sequences one per row (a 0/1 mask, the layout every
  backend is checked on against ``transformers`` in test_attention.py and test_hf_parity.py).
  gemma3: a 4-token sliding layer, then a global one (sequences longer than the window).
  cudnn (llama): its masking run by XLA (cuDNN needs a GPU) after the forward's row rotation,
  packed rows taking the blockwise fallback (the other families run blockwise directly)."""
  if backend == "cudnn":
    monkeypatch.setattr(attn, "cudnn_attention",
                        functools.partial(attn.cudnn_attention, implementation="xla"))
  cfg, params = _family_config(family)
  cfg = cfg.replace(attention=backend, attention_block=4)
  tokens, mask, packed, seg, where = _batches()
  run = jax.jit(lambda p, t, m: transformer.forward_with_routes(cfg, p, t, m)[::2])
  alone, alone_moe = run(params, tokens, mask)
  hidden, moe = run(params, packed, seg)
  alone, hidden = np.asarray(alone), np.asarray(hidden)
  # float32 sums of D terms per projection, a few per layer: a few ulps x sqrt(D * layers).
  tol = 8 * np.finfo(np.float32).eps * np.sqrt(cfg.hidden_size * cfg.num_layers)
  logp_alone, logp = _log_probs(cfg, params, alone), _log_probs(cfg, params, hidden)
  for i, n in enumerate(LENGTHS):
    row, lo = where[i]
    want, got = alone[i, -n:], hidden[row, lo:lo + n]
    assert np.abs(got - want).max() <= tol * max(np.abs(want).max(), 1.0), (family, i)
    scale = max(np.abs(logp_alone[i, -n:]).max(), 1.0)
    assert np.abs(logp[row, lo:lo + n] - logp_alone[i, -n:]).max() <= 10 * tol * scale, (family, i)
    if moe is not None:
      np.testing.assert_array_equal(np.asarray(moe.routes)[row, lo:lo + n],
                                    np.asarray(alone_moe.routes)[i, -n:])
  if moe is not None:  # the load-balancing loss over the same valid tokens
    assert abs(float(moe.aux_loss) - float(alone_moe.aux_loss)) <= 1e-6
  # The same rows read as one sequence each (a 0/1 mask) give other states: the segments matter.
  crossing = np.asarray(run(params, packed, (seg > 0).astype(seg.dtype))[0])
  row, lo = where[1]
  assert np.abs(crossing[row, lo:lo + LENGTHS[1]] - alone[1, -LENGTHS[1]:]).max() > 1e3 * tol


def test_packed_gradient_equals_each_sequence_alone():
  """d/d(params) of the next-token log-likelihood (within each sequence) of gemma3 (sliding and
  global layers, blockwise backward with segment and window skipping): packed rows against the
  sequences one per row; the same terms, summed in another order."""
  cfg, params = _family_config("gemma3")
  cfg = cfg.replace(attention="blockwise", attention_block=4)
  tokens, mask, packed, seg, _ = _batches()

  def nll(p, t, s):
    hidden = transformer.forward(cfg, p, t, s)
    logp = jax.nn.log_softmax(transformer.bind(cfg, p).logits(hidden)[:, :-1], -1)
    picked = jnp.take_along_axis(logp, t[:, 1:, None], -1)[..., 0]
    same = (s[:, :-1] == s[:, 1:]) & (s[:, :-1] > 0)  # the next token is of the same sequence
    return -(picked * same).sum()

  grad = jax.jit(jax.grad(nll))
  got, want = (jax.tree.leaves(grad(params, t, s)) for t, s in ((packed, seg), (tokens, mask)))
  for g, w in zip(got, want):
    scale = max(np.abs(np.asarray(w)).max(), 1e-3)
    assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-5 * scale

"""Every attention backend that runs on this machine against a float64 NumPy re-implementation of
the formula, against the materialised reference (today's attention), and, inside the model,
against ``transformers``; gradients too. Shapes are small but span several blocks, with left and
right padding, GQA and a sliding window."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.models import attention as attn
from rljax.models import transformer
from tests import hf_models

B, T, H, G, DH = 3, 150, 4, 2, 8
BLOCK = 40  # blockwise: 4 query x 4 key blocks of 38 (balanced), the last one partial


def _numpy_attention(q, k, v, valid, q_offset=0, window=None):
  """float64 formula: softmax over allowed keys (causal by slot, window, key mask)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b, s, h, dh = q.shape
  r = h // k.shape[2]
  k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
  scores = np.einsum("bshd,bkhd->bhsk", q, k) / np.sqrt(dh)
  qs, ks = q_offset + np.arange(s), np.arange(k.shape[1])
  ok = (ks[None, :] <= qs[:, None])
  if window is not None:
    ok &= qs[:, None] - ks[None, :] < window
  ok = ok[None, None] & np.asarray(valid)[:, None, None, :]
  scores = np.where(ok, scores, -np.inf)
  p = np.where(ok, np.exp(scores - np.where(ok, scores, -1e300).max(-1, keepdims=True)), 0.0)
  p = p / np.maximum(p.sum(-1, keepdims=True), 1e-300)  # rows with no allowed key: 0
  return np.einsum("bhsk,bkhd->bshd", p, v)


@pytest.fixture(scope="module")
def inputs():
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (B, T, H, DH))
  k = jax.random.normal(ks[1], (B, T, G, DH))
  v = jax.random.normal(ks[2], (B, T, G, DH))
  valid = np.zeros((B, T), bool)
  valid[0, :] = True  # full row
  valid[1, 40:] = True  # left-padded prompt
  valid[2, 17:121] = True  # left-padded prompt + right-padded completion
  cotangent = jax.random.normal(ks[3], (B, T, H, DH)) * valid[:, :, None, None]
  return q, k, v, jnp.asarray(valid), cotangent


BACKENDS = {
    "blockwise": lambda q, k, v, m, w: attn.blockwise_attention(q, k, v, m, window=w, block=BLOCK),
    # The cuDNN backend's masking (row rotation + sequence lengths + is_causal) through the same
    # jax.nn.dot_product_attention call, with XLA's implementation (cuDNN needs a GPU).
    "cudnn_masking": lambda q, k, v, m, w: attn.cudnn_attention(q, k, v, m, window=w,
                                                                implementation="xla"),
    # Pallas splash attention in interpret mode (the TPU kernel, run on CPU).
    "pallas_interpret": lambda q, k, v, m, w: attn.splash_attention(q, k, v, m, window=w,
                                                                    interpret=True),
}


@functools.lru_cache(maxsize=None)
def _value_and_grad(name, window):
  fn = BACKENDS[name] if name != "xla" else (
      lambda q, k, v, m, w: attn.reference_attention(q, k, v, m, window=w))

  def loss(q, k, v, m, ct):
    out = fn(q, k, v, m, window)
    return (out * ct).sum(), out
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_backend_matches_numpy_and_reference(name, window, inputs):
  q, k, v, valid, ct = inputs
  (_, out), grads = _value_and_grad(name, window)(q, k, v, valid, ct)
  (_, ref_out), ref_grads = _value_and_grad("xla", window)(q, k, v, valid, ct)
  rows = np.asarray(valid)
  exact = _numpy_attention(q, k, v, valid, window=window)
  assert np.abs(np.asarray(out) - exact)[rows].max() <= 1e-5
  assert np.abs(np.asarray(out) - np.asarray(ref_out))[rows].max() <= 1e-5
  for got, want in zip(grads, ref_grads):
    scale = np.abs(np.asarray(want)).max()
    assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-5 * max(scale, 1.0)


def test_gradient_matches_central_differences(inputs):
  """d/dq of the blockwise attention against float64 central differences of the NumPy formula."""
  q, k, v, valid, ct = inputs
  (_, _), (dq, _, _) = _value_and_grad("blockwise", 7)(q, k, v, valid, ct)
  qn, ctn = np.asarray(q, np.float64), np.asarray(ct, np.float64)
  f = lambda x: (_numpy_attention(x, k, v, valid, window=7) * ctn).sum()
  eps = 1e-4
  for idx in [(1, 60, 3, 2), (2, 100, 0, 5), (0, 0, 1, 7)]:
    up, down = qn.copy(), qn.copy()
    up[idx] += eps
    down[idx] -= eps
    assert abs((f(up) - f(down)) / (2 * eps) - float(dq[idx])) <= 1e-4


def test_queries_at_an_offset_match_numpy(inputs):
  """Decode-like queries (slot offset, traced) against a longer key range, with a window."""
  q, k, v, valid, _ = inputs
  offset = 130
  qq = q[:, offset:offset + 3]
  exact = _numpy_attention(qq, k, v, valid, q_offset=offset, window=20)
  for fn in (attn.attention, attn.blockwise_attention):
    run = jax.jit(lambda o, fn=fn: fn(qq, k, v, valid, q_offset=o, window=20, block=BLOCK))
    assert np.abs(np.asarray(run(jnp.int32(offset))) - exact).max() <= 1e-5


@pytest.mark.parametrize("n, block, want", [
    (150, 40, 38), (264, 128, 88), (136, 128, 68), (128, 128, 128), (100, 128, 100), (1, 128, 1),
    (1032, 128, 115)])
def test_balanced_block_splits_evenly(n, block, want):
  """ceil(n / block) blocks of near-equal size: never above ``block``, less than one block of
  padding in all (hand-worked: 264 = 3 x 88 where blocks of 128 would pad to 384)."""
  got = attn.balanced_block(n, block)
  blocks = -(-n // got)
  assert got == want
  assert got <= block and blocks == -(-n // block) and blocks * got - n < blocks


def test_long_padded_rows_blockwise_equals_reference():
  """T = 1024 with heavy left padding and a ragged right edge: blockwise == materialised."""
  t = 1024
  ks = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(ks[0], (2, t, 4, 16))
  k = jax.random.normal(ks[1], (2, t, 2, 16))
  v = jax.random.normal(ks[2], (2, t, 2, 16))
  valid = np.zeros((2, t), bool)
  valid[0, 350:] = True
  valid[1, 750:1000] = True
  out = jax.jit(lambda *a: attn.blockwise_attention(*a, block=128))(q, k, v, jnp.asarray(valid))
  ref = jax.jit(attn.reference_attention)(q, k, v, jnp.asarray(valid))
  assert np.abs(np.asarray(out) - np.asarray(ref))[valid].max() <= 1e-5


def test_unknown_backend_is_named():
  with pytest.raises(ValueError, match="model.attention='flash'.*blockwise"):
    attn.resolve_backend("flash", dtype=jnp.float32, self_attention=True)
  with pytest.raises(ValueError, match="model.attention"):
    models.ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                       num_heads=1, num_kv_heads=1, head_dim=8, attention="flash")


def test_auto_picks_blockwise_on_cpu_and_for_cache_queries():
  if jax.default_backend() == "cpu":
    assert attn.resolve_backend("auto", dtype=jnp.bfloat16, self_attention=True) == "blockwise"
  assert attn.resolve_backend("pallas", dtype=jnp.float32, self_attention=False,
                              num_queries=1) == "xla"
  assert attn.resolve_backend("pallas", dtype=jnp.float32, self_attention=False,
                              num_queries=attn.DEFAULT_BLOCK + 1) == "blockwise"


# --- inside the model, against transformers --------------------------------------------------

MODEL_BACKENDS = ["xla", "blockwise", "pallas"]


@functools.lru_cache(maxsize=None)
def _model_logits(cfg):
  return jax.jit(functools.partial(transformer.logits, cfg))


@pytest.fixture(scope="module")
def long_batch():
  """Rows of 200, 131 and 64 tokens, left-padded to 200 (the tiny models hold 256 positions)."""
  return hf_models.left_padded([200, 131, 64], width=200, vocab=hf_models.VOCAB, seed=2)


@pytest.mark.parametrize("backend", MODEL_BACKENDS)
def test_model_logits_every_backend_match_transformers(backend, hf_dirs, long_batch):
  tokens, mask = long_batch
  cfg, params = models.load_hf(hf_dirs["qwen2"])  # GQA (4 heads over 2) with q/k/v biases
  cfg_ref = cfg.replace(attention="xla")
  cfg = cfg.replace(attention=backend, attention_block=64)
  ours = np.asarray(_model_logits(cfg)(params, tokens, mask))
  today = np.asarray(_model_logits(cfg_ref)(params, tokens, mask))
  theirs = hf_models.hf_logits(hf_dirs["qwen2"], tokens, mask)
  valid = mask.astype(bool)
  assert np.abs(ours - today)[valid].max() <= 1e-5
  assert np.abs(ours - theirs)[valid].max() <= 1e-4


def test_remat_policies_and_old_spellings():
  kw = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
            num_kv_heads=1, head_dim=8)
  assert models.ModelConfig(**kw, remat=True).remat == "full"
  assert models.ModelConfig(**kw, remat="False").remat == "none"
  assert models.ModelConfig(**kw, remat="dots").remat == "dots"
  with pytest.raises(ValueError, match="model.remat='some'.*dots"):
    models.ModelConfig(**kw, remat="some")


def _nll(cfg, params, tokens, mask):
  logits = transformer.logits(cfg, params, tokens, mask)[:, :-1]
  logp = jax.nn.log_softmax(logits, -1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  # Only predictions made at valid positions (a padded query's output is unspecified).
  return -(picked * mask[:, 1:] * mask[:, :-1]).sum()


@pytest.mark.slow
def test_model_gradients_agree_across_backends_and_remat(hf_dirs, left_padded_batch):
  """d(NLL)/d(params): blockwise (3 x 3 blocks) with each remat policy and Pallas against the
  materialised attention without remat, left-padded rows of 12 tokens."""
  tokens, mask = left_padded_batch
  cfg, params = models.load_hf(hf_dirs["qwen2"])
  grad = lambda c: jax.jit(jax.grad(functools.partial(_nll, c)))(params, tokens, mask)
  want = jax.tree.leaves(grad(cfg.replace(attention="xla")))
  for attention, remat in [("blockwise", "none"), ("blockwise", "full"), ("blockwise", "dots"),
                           ("pallas", "none")]:
    got = jax.tree.leaves(grad(cfg.replace(attention=attention, remat=remat, attention_block=4)))
    for g, w in zip(got, want):
      scale = max(np.abs(np.asarray(w)).max(), 1e-3)
      assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-5 * scale * 10, (attention, remat)


def test_remat_keeps_the_named_self_attention_kernel():
  """Under remat the training forward still reaches the Pallas kernel (a traced query offset
  would send it to the blockwise path), and the cached path still accepts a traced offset."""
  from unittest import mock
  cfg = models.ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_layers=1,
                           num_heads=4, num_kv_heads=2, head_dim=8, remat="full",
                           attention="pallas")
  params = jax.jit(lambda: transformer.init_params(cfg))()
  tokens, mask = jnp.ones((2, 16), jnp.int32), jnp.ones((2, 16), jnp.int32)
  calls = []
  kernel = attn.splash_attention
  with mock.patch.object(attn, "splash_attention",
                         lambda *a, **k: calls.append(1) or kernel(*a, **k)):
    # remat wraps the forward too; jitted (one program), as the train step runs it
    jax.jit(functools.partial(transformer.logits, cfg))(params, tokens, mask)
  assert len(calls) == cfg.num_layers
  cache = transformer.init_cache(cfg, 2, 20)
  step = jax.jit(lambda p, i: transformer.cached_step(cfg, p, tokens[:, :1], jnp.zeros((2, 1), jnp.int32),
                                                 cache, i, jnp.ones((2, 20), jnp.int32)))
  assert step(params, 3)[0].shape == (2, 1, 32)


def test_auto_never_picks_blockwise_on_accelerators(monkeypatch):
  """A float32-compute run on a GPU gets cuDNN's fused kernel (in bfloat16 inputs), not the
  pure-JAX blockwise one; the plan predicts the same choice."""
  from rljax import plan
  for dtype in (jnp.float32, jnp.bfloat16):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert attn.resolve_backend("auto", dtype=dtype, self_attention=True) == "cudnn"
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert attn.resolve_backend("auto", dtype=dtype, self_attention=True) == "pallas"
  assert plan.planned_attention("auto", "NVIDIA H100 80GB HBM3") == "cudnn"
  assert plan.planned_attention("auto", "cpu") == "blockwise"


def test_cudnn_rows_are_aligned_once_per_forward(monkeypatch):
  """With cuDNN the forward rotates its rows once (before the embedding, back after the final
  norm), not q, k, v and the output in every layer: the model's logits and gradients equal the
  materialised attention's on left- and right-padded rows (cuDNN's masking run by XLA, which
  needs no GPU), and the forward's gathers do not grow with the number of layers."""
  import functools as ft
  monkeypatch.setattr(attn, "cudnn_attention",
                      ft.partial(attn.cudnn_attention, implementation="xla"))
  kw = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
            head_dim=8)
  tokens = jax.random.randint(jax.random.key(1), (3, 12), 0, 50)
  mask = np.zeros((3, 12), np.int32)
  mask[0, :] = 1
  mask[1, 5:] = 1  # left padding
  mask[2, 3:9] = 1  # left padding, a prompt + a completion ending early
  mask = jnp.asarray(mask)
  cfg = models.ModelConfig(**kw, num_layers=2, attention="cudnn")
  # Init, forwards and gradients jitted: op by op, every op compiles on its own, several times
  # slower than one program.
  params = jax.jit(lambda: transformer.init_params(cfg))()
  ref = cfg.replace(attention="xla")
  valid = np.asarray(mask, bool)
  got, want = (np.asarray(jax.jit(ft.partial(transformer.logits, c))(params, tokens, mask))
               for c in (cfg, ref))
  assert np.abs(got - want)[valid].max() <= 1e-5
  g_got, g_want = (jax.tree.leaves(jax.jit(jax.grad(ft.partial(_nll, c)))(params, tokens, mask))
                   for c in (cfg, ref))
  for g, w in zip(g_got, g_want):
    assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-5 * max(np.abs(w).max(), 1e-3)

  def gathers(num_layers):  # in the compiled forward (rotating in every layer: 4 per layer)
    import re
    c = cfg.replace(num_layers=num_layers)
    shapes = jax.eval_shape(lambda: transformer.init_params(c))  # lowering needs only the shapes
    hlo = jax.jit(ft.partial(transformer.logits, c)).lower(shapes, tokens, mask).compile().as_text()
    return len(re.findall(r"= \S+ gather\(", hlo))
  assert gathers(1) == gathers(3)

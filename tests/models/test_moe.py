"""The MoE block against ``transformers``' ``Qwen3MoeSparseMoeBlock`` (random weights, CPU torch),
and its capacity and sparse dispatches, router replay and load-balancing loss against float64
NumPy loops written from the formulas (module docstring of ``rljax.models.moe``). Tiny shapes:
cheap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models import moe
from tests import hf_models

B, S, D, F, E, K = 2, 5, 16, 8, 4, 2


def _block(norm_topk_prob=True, dispatch="dense", capacity_factor=1.25, params=None, k=K,
           dtype="float32"):
  """An MoE module, with ``params`` (a pure dict in the documented tree) loaded if given."""
  block = moe.MoE(hidden_size=D, moe_intermediate_size=F, num_experts=E, experts_per_token=k,
                  norm_topk_prob=norm_topk_prob, param_dtype="float32", dtype=dtype,
                  rngs=nnx.Rngs(0), dispatch=dispatch, capacity_factor=capacity_factor)
  if params is not None:
    graphdef, state = nnx.split(block)
    nnx.replace_by_pure_dict(state, params)
    block = nnx.merge(graphdef, state)
  return block


def _random_params(seed=0):
  """Weights large enough (std 1 router, 0.3 experts) that routing is far from uniform."""
  rng = np.random.default_rng(seed)
  return {"router": {"kernel": rng.normal(size=(D, E)).astype(np.float32)},
          "gate_proj": (0.3 * rng.normal(size=(E, D, F))).astype(np.float32),
          "up_proj": (0.3 * rng.normal(size=(E, D, F))).astype(np.float32),
          "down_proj": (0.3 * rng.normal(size=(E, F, D))).astype(np.float32)}


def _inputs(seed=1, b=B, s=S):
  return np.random.default_rng(seed).normal(size=(b, s, D)).astype(np.float32)


# ---- float64 NumPy references, written from the formulas -------------------------------------


def _np_probs(params, x):
  logits = np.asarray(x, np.float64).reshape(-1, D) @ np.asarray(params["router"]["kernel"],
                                                                 np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


def _np_top_k(probs, k):
  return np.argsort(-probs, axis=-1, kind="stable")[:, :k]


def _np_gates(probs, routes, norm_topk_prob):
  g = np.take_along_axis(probs, routes, axis=-1)
  return g / g.sum(-1, keepdims=True) if norm_topk_prob else g


def _np_expert(params, e, x_t):
  p = {n: np.asarray(params[n], np.float64) for n in ("gate_proj", "up_proj", "down_proj")}
  h = x_t @ p["gate_proj"][e]
  return ((h / (1 + np.exp(-h))) * (x_t @ p["up_proj"][e])) @ p["down_proj"][e]


def _np_moe(params, x, routes, gates, keep=None):
  """``y_t = sum_j keep_tj g_tj expert_{r_tj}(x_t)``, token by token."""
  xs = np.asarray(x, np.float64).reshape(-1, D)
  keep = np.ones(routes.shape, bool) if keep is None else keep
  y = np.zeros_like(xs)
  for t in range(xs.shape[0]):
    for j in range(routes.shape[1]):
      if keep[t, j]:
        y[t] += gates[t, j] * _np_expert(params, routes[t, j], xs[t])
  return y.reshape(np.shape(x))


def _np_capacity_keep(routes, valid, capacity):
  """Which (token, choice) pairs get a slot: every token's 1st choice in token order, then every
  token's 2nd, ...; padding takes no slot; an expert takes at most ``capacity`` pairs."""
  used, keep, dropped = np.zeros(E, int), np.zeros(routes.shape, bool), 0
  for j in range(routes.shape[1]):
    for t in range(routes.shape[0]):
      if not valid[t]:
        continue
      e = routes[t, j]
      if used[e] < capacity:
        used[e] += 1
        keep[t, j] = True
      else:
        dropped += 1
  return keep, dropped


def _np_load_balancing_loss(logits, top_k, attention_mask):
  """``transformers.models.qwen3_moe.modeling_qwen3_moe.load_balancing_loss_func`` for one layer
  with an attention mask, line by line in NumPy."""
  logits = np.asarray(logits, np.float64)
  num_experts = logits.shape[-1]
  routing_weights = np.exp(logits - logits.max(-1, keepdims=True))
  routing_weights /= routing_weights.sum(-1, keepdims=True)
  selected_experts = _np_top_k(routing_weights, top_k)
  flat_mask = np.asarray(attention_mask, np.float64).reshape(-1)
  tokens_per_expert_sum = np.zeros(num_experts)
  np.add.at(tokens_per_expert_sum, selected_experts.reshape(-1), np.repeat(flat_mask, top_k))
  router_prob_sum = (routing_weights * flat_mask[:, None]).sum(0)
  total_rows = flat_mask.sum()
  return np.sum(tokens_per_expert_sum / total_rows * router_prob_sum / total_rows) * num_experts


# ---- 1. against transformers ------------------------------------------------------------------


def _hf_block(norm_topk_prob, seed=0):
  """A random ``Qwen3MoeSparseMoeBlock`` and the same weights in our tree."""
  torch = pytest.importorskip("torch")
  from transformers.models.qwen3_moe import modeling_qwen3_moe as hf
  config = hf.Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=F, num_experts=E,
                             num_experts_per_tok=K, norm_topk_prob=norm_topk_prob)
  torch.manual_seed(seed)
  block = hf.Qwen3MoeSparseMoeBlock(config).float()
  with torch.no_grad():
    block.gate.weight.normal_(0.0, 1.0)  # initialised to zeros: every token would tie
    block.experts.gate_up_proj.normal_(0.0, 0.3)
    block.experts.down_proj.normal_(0.0, 0.3)
  gate_up = block.experts.gate_up_proj.detach().numpy()  # [E, 2F, D], gate rows first
  params = {"router": {"kernel": block.gate.weight.detach().numpy().T},
            "gate_proj": gate_up[:, :F].transpose(0, 2, 1),
            "up_proj": gate_up[:, F:].transpose(0, 2, 1),
            "down_proj": block.experts.down_proj.detach().numpy().transpose(0, 2, 1)}
  return block, params


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_matches_transformers_qwen3_moe_block(norm_topk_prob):
  torch = pytest.importorskip("torch")
  hf_block, params = _hf_block(norm_topk_prob)
  x = _inputs()
  with torch.no_grad():
    want = hf_block(torch.from_numpy(x)).numpy()
    _, _, want_routes = hf_block.gate(torch.from_numpy(x).reshape(-1, D))
  # Capacity factor E / k: C = T, so no expert can overflow.
  for dispatch, factor in (("dense", 1.25), ("sparse", 1.25), ("capacity", E / K)):
    y, stats = _block(norm_topk_prob, dispatch, factor, params)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=0, err_msg=dispatch)
    np.testing.assert_array_equal(np.asarray(stats.routes).reshape(-1, K), want_routes.numpy())
    assert int(stats.dropped) == 0
    assert stats.capacity == (B * S if dispatch == "capacity" else 0)


def test_param_tree_and_logical_axes():
  block = _block()
  shapes = jax.tree.map(np.shape, nnx.to_pure_dict(nnx.state(block, nnx.Param)))
  assert shapes == {"router": {"kernel": (D, E)}, "gate_proj": (E, D, F), "up_proj": (E, D, F),
                    "down_proj": (E, F, D)}
  axes = {"/".join(str(p) for p in path): node.get_metadata()["logical_axes"]
          for path, node in nnx.iter_graph(block) if isinstance(node, nnx.Param)}
  assert axes == {"router/kernel": ("embed", None),
                  "gate_proj": ("experts", "embed", "mlp"),
                  "up_proj": ("experts", "embed", "mlp"),
                  "down_proj": ("experts", "mlp", "embed")}


# ---- 2. capacity dispatch ---------------------------------------------------------------------


def test_capacity_drops_and_combine_match_numpy_queue():
  params, x = _random_params(), _inputs(b=2, s=8)
  valid = np.ones((2, 8), bool)
  valid[1, :3] = False  # left padding: must take no slot
  factor = 0.5
  block = _block(True, "capacity", factor, params)
  y, stats = block(jnp.asarray(x), jnp.asarray(valid))

  probs = _np_probs(params, x)
  routes = _np_top_k(probs, K)
  np.testing.assert_array_equal(np.asarray(stats.routes).reshape(-1, K), routes)
  capacity = int(np.ceil(factor * 16 * K / E))
  keep, dropped = _np_capacity_keep(routes, valid.reshape(-1), capacity)
  assert stats.capacity == capacity
  assert dropped > 0 and int(stats.dropped) == dropped
  want = _np_moe(params, x, routes, _np_gates(probs, routes, True), keep)
  np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=0)
  assert not np.asarray(y)[1, :3].any()  # padding got no expert

# ---- 3. sparse (dropless grouped-matmul) dispatch --------------------------------------------

EPS32 = float(np.finfo(np.float32).eps)


def _sum_tolerance(n_terms, reference):
  """Float32 error bound of sums of ``n_terms`` rounded terms, at the reference's magnitude:
  ``n eps max|ref|`` (the classic ``n eps`` bound of recursive summation)."""
  return n_terms * EPS32 * max(float(np.max(np.abs(np.asarray(x))))
                               for x in jax.tree.leaves(reference))


def _uneven_routes(seed=4, b=B, s=S):
  """Routes [b, s, K] with expert 0 chosen by no token and expert 1 by every token (its first
  choice); the second choice drawn from 2..E-1."""
  rng = np.random.default_rng(seed)
  routes = np.ones((b, s, K), np.int32)
  routes[..., 1] = rng.integers(2, E, (b, s))
  return routes


def _np_layout(routes, num_experts, block):
  """``sparse_layout`` by a loop: experts in order, each expert's pairs in t-major order, every
  group starting on a block boundary."""
  flat = routes.reshape(-1)
  slot, source, block_expert, row = np.zeros(flat.size, int), {}, {}, 0
  for e in range(num_experts):
    pairs = [i for i in range(flat.size) if flat[i] == e]
    for n in range(len(pairs)):
      slot[pairs[n]] = row + n
      source[row + n] = pairs[n] // routes.shape[1]
    for blk in range(row // block, row // block + -(-len(pairs) // block)):
      block_expert[blk] = e
    row += -(-len(pairs) // block) * block
  return slot, source, block_expert, row


@pytest.mark.parametrize("block", [1, 3, 4])
def test_sparse_layout_matches_numpy_loop(block):
  routes = _uneven_routes().reshape(-1, K)
  t = routes.shape[0]
  layout = moe.sparse_layout(jnp.asarray(routes), E, block)
  slot, source, block_expert, rows = _np_layout(routes, E, block)
  np.testing.assert_array_equal(np.asarray(layout.slot), slot)
  got_source = np.asarray(layout.source)
  assert got_source.size == moe.num_blocks(t * K, E, block) * block >= rows
  for r in range(got_source.size):  # every other row is padding: reads the zero row T
    assert got_source[r] == source.get(r, t), r
  got_experts = np.asarray(layout.block_expert)
  assert {n: int(got_experts[n]) for n in block_expert} == block_expert
  assert (got_experts[rows // block:] == E - 1).all()  # unused blocks: padding rows only


@pytest.mark.parametrize("pairs,experts", [(1, 4), (20, 4), (512, 64), (8192, 64), (10**6, 8)])
def test_block_rows_bound_the_padding(pairs, experts):
  b = moe.block_rows(pairs, experts)
  assert 1 <= b <= moe.MAX_BLOCK_ROWS
  padding = moe.num_blocks(pairs, experts, b) * b - pairs
  assert padding <= moe.MAX_BLOCK_PADDING * pairs or b == 1 and padding == 0
  # The worst case: every expert but one holds one pair, the last one the rest.
  worst = np.minimum(np.arange(pairs), experts - 1)
  sizes = np.bincount(worst, minlength=experts)
  assert (-(-sizes // b) * b).sum() <= moe.num_blocks(pairs, experts, b) * b


def _outputs_and_grads(block, x, routes, cotangent):
  """``(y, d sum(y * cotangent) / d(params, x))`` of an MoE module, jitted once per block."""
  graphdef, state = nnx.split(block)

  @jax.jit
  def run(st, x, routes):
    def loss(st, x):
      y, _ = nnx.merge(graphdef, st)(x, None, routes)
      return jnp.sum(y * cotangent), y
    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(st, x)
    return y, (nnx.to_pure_dict(grads[0]), grads[1])
  return run(state, x, routes)


@pytest.mark.parametrize("replay", [False, True])
def test_sparse_equals_dense_outputs_and_gradients(replay):
  params, x = _random_params(), jnp.asarray(_inputs())
  # Replayed routes leave expert 0 without a token and give expert 1 every token.
  routes = jnp.asarray(_uneven_routes()) if replay else None
  cotangent = jax.random.normal(jax.random.key(5), x.shape)
  y_dense, g_dense = _outputs_and_grads(_block(params=params), x, routes, cotangent)
  y_sparse, g_sparse = _outputs_and_grads(_block(dispatch="sparse", params=params), x, routes,
                                          cotangent)
  # y sums D (gate/up), F (down) and k (experts) terms; a kernel's gradient also sums T tokens.
  np.testing.assert_allclose(np.asarray(y_sparse), np.asarray(y_dense), rtol=0,
                             atol=_sum_tolerance(D + F + K, y_dense))
  tol = _sum_tolerance(B * S + D + F + K, g_dense)
  for a, b in zip(jax.tree.leaves(g_sparse), jax.tree.leaves(g_dense)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=tol)
  if replay:  # and both against the float64 loop
    r = np.asarray(routes).reshape(-1, K)
    want = _np_moe(params, x, r, _np_gates(_np_probs(params, x), r, True))
    np.testing.assert_allclose(np.asarray(y_sparse), want, rtol=0, atol=1e-5)
    # Expert 0 saw no token: no gradient; expert 1 saw every token.
    assert not np.asarray(g_sparse[0]["gate_proj"])[0].any()
    assert np.abs(np.asarray(g_sparse[0]["gate_proj"])[1]).max() > 1e-3


def test_sparse_qwen3_moe_model_matches_transformers_and_dense(hf_dirs, left_padded_batch):
  """The tiny Qwen3-MoE checkpoint: sparse logits against ``transformers``, and the gradient of
  a log-prob loss against the dense dispatch's, with and without router replay."""
  from rljax import models
  from rljax.models import transformer
  tokens, mask = left_padded_batch
  cfg, params = models.load_hf(hf_dirs["qwen3_moe"])
  valid = mask.astype(bool)

  def loss_fn(cfg):
    def loss(params, routes):
      hidden, model, out = transformer.forward_with_routes(cfg, params, tokens, mask,
                                                           routes=routes)
      logits = model.logits(hidden).astype(jnp.float32)
      logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None],
                                 axis=-1)[..., 0]
      return -jnp.sum(logp * (mask[:, :-1] * mask[:, 1:])), (logits, out.routes)
    return jax.jit(jax.value_and_grad(loss, has_aux=True))

  dense, sparse = loss_fn(cfg), loss_fn(cfg.replace(moe_dispatch="sparse"))
  (_, (logits, routes)), grads = sparse(params, None)
  theirs = hf_models.hf_logits(hf_dirs["qwen3_moe"], tokens, mask)
  assert np.abs(np.asarray(logits) - theirs)[valid].max() <= 1e-4
  (_, (_, dense_routes)), dense_grads = dense(params, None)
  np.testing.assert_array_equal(np.asarray(routes), np.asarray(dense_routes))
  # Replay of other experts (R3): each token's choices shifted by one.
  other = (routes + 1) % cfg.num_experts
  (_, _), replay_grads = sparse(params, other)
  (_, _), dense_replay_grads = dense(params, other)
  for got, want in ((grads, dense_grads), (replay_grads, dense_replay_grads)):
    terms = tokens.size + cfg.hidden_size + cfg.moe_intermediate_size + cfg.vocab_size
    tol = _sum_tolerance(terms, want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=tol)
  moe_grads = replay_grads["layers_1"]["mlp"]
  assert np.abs(np.asarray(moe_grads["router"]["kernel"])).max() > 0


# ---- 4. router replay -------------------------------------------------------------------------


def test_replay_of_own_routes_is_identical():
  params, x = _random_params(), jnp.asarray(_inputs())
  for dispatch in moe.DISPATCHES:
    block = _block(True, dispatch, 2.0, params)
    y, stats = block(x)
    y_replay, stats_replay = block(x, routes=stats.routes)
    np.testing.assert_array_equal(np.asarray(y_replay), np.asarray(y), err_msg=dispatch)
    np.testing.assert_array_equal(np.asarray(stats_replay.routes), np.asarray(stats.routes))
    assert float(stats_replay.aux_loss) == float(stats.aux_loss)


@pytest.mark.parametrize("norm_topk_prob,dispatch", [(True, "dense"), (False, "dense"),
                                                     (True, "sparse")])
def test_replay_of_other_routes_uses_current_probs(norm_topk_prob, dispatch):
  params, x = _random_params(), _inputs()
  block = _block(norm_topk_prob, dispatch, params=params)
  _, stats = block(jnp.asarray(x))
  other = (np.asarray(stats.routes) + 1) % E  # still k distinct experts per token
  graphdef, state = nnx.split(block)
  # Under jit the ids are traced: no host check, same result.
  replay = jax.jit(lambda st, x, r: nnx.merge(graphdef, st)(x, None, r))
  y, replay_stats = replay(state, jnp.asarray(x), jnp.asarray(other, jnp.int32))
  routes = other.reshape(-1, K)
  probs = _np_probs(params, x)
  want = _np_moe(params, x, routes, _np_gates(probs, routes, norm_topk_prob))
  np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(np.asarray(replay_stats.routes), other)


def test_replay_keeps_the_router_gradient():
  params, x = _random_params(), jnp.asarray(_inputs())
  block = _block(True, "dense", params=params)
  _, stats = block(x)
  cotangent = jax.random.normal(jax.random.key(2), x.shape)
  graphdef, state = nnx.split(block)

  @jax.jit  # one compile instead of one per primitive of the eager backward pass
  def router_grads(routes):
    def loss(st):
      y, _ = nnx.merge(graphdef, st)(x, None, routes)
      return jnp.sum(y * cotangent)
    return jax.grad(loss)(state)["router"]["kernel"][...]

  replayed = np.asarray(router_grads(stats.routes))
  assert np.abs(replayed).max() > 1e-4
  np.testing.assert_allclose(replayed, np.asarray(router_grads(None)), atol=1e-6, rtol=1e-5)


# ---- 5. load-balancing loss -------------------------------------------------------------------


def test_load_balancing_loss_matches_transformers_formula():
  rng = np.random.default_rng(3)
  t = 24
  logits = rng.normal(size=(t, E)).astype(np.float32) * 2
  mask = np.ones(t, bool)
  mask[:5] = mask[-3:] = False
  want = _np_load_balancing_loss(logits, K, mask)
  probs = jax.nn.softmax(jnp.asarray(logits), axis=-1)
  routes = jax.lax.top_k(probs, K)[1]
  got = moe.load_balancing_loss(probs, routes, jnp.asarray(mask))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  # The NumPy transcription is itself checked against the torch function.
  torch = pytest.importorskip("torch")
  from transformers.models.qwen3_moe import modeling_qwen3_moe as hf
  torch_loss = hf.load_balancing_loss_func((torch.from_numpy(logits),), E, K,
                                           torch.from_numpy(mask))
  np.testing.assert_allclose(float(torch_loss), want, rtol=1e-5)
  # Padding rows are excluded: changing them changes nothing.
  changed = jnp.asarray(np.where(mask[:, None], logits, -logits))
  probs2 = jax.nn.softmax(changed, axis=-1)
  got2 = moe.load_balancing_loss(probs2, jax.lax.top_k(probs2, K)[1], jnp.asarray(mask))
  np.testing.assert_allclose(float(got2), float(got), rtol=1e-6)


def test_block_aux_loss_is_the_loss_of_its_routing():
  params, x = _random_params(), _inputs()
  valid = np.ones((B, S), bool)
  valid[0, :2] = False
  _, stats = _block(params=params)(jnp.asarray(x), jnp.asarray(valid))
  logits = x.reshape(-1, D).astype(np.float64) @ params["router"]["kernel"]
  np.testing.assert_allclose(float(stats.aux_loss), _np_load_balancing_loss(logits, K, valid),
                             rtol=1e-5)


# ---- 6. bad inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(B * S, K), (B, S, K + 1), (B, S + 1, K), (B, S, K, 1)])
def test_misshaped_routes_raise_naming_the_shape(shape):
  with pytest.raises(ValueError, match=r"\[B, S, k\] = \(2, 5, 2\)"):
    _block()(jnp.asarray(_inputs()), routes=np.zeros(shape, np.int32))


@pytest.mark.parametrize("bad", [E, -1])
def test_out_of_range_routes_raise(bad):
  routes = np.zeros((B, S, K), np.int32)
  routes[1, 2, 1] = bad
  with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
    _block()(jnp.asarray(_inputs()), routes=jnp.asarray(routes))
  with pytest.raises(ValueError, match="integer"):
    _block()(jnp.asarray(_inputs()), routes=np.zeros((B, S, K), np.float32))


def test_bad_constructor_arguments_raise():
  with pytest.raises(ValueError, match="allowed"):
    _block(dispatch="ragged")
  with pytest.raises(ValueError, match="experts_per_token"):
    _block(k=E + 1)
  with pytest.raises(ValueError, match="capacity_factor"):
    _block(dispatch="capacity", capacity_factor=0.0)


def test_computes_in_dtype_bf16_same_routes():
  params, x = _random_params(), jnp.asarray(_inputs())
  y32, stats32 = _block(params=params)(x)
  y16, stats16 = _block(params=params, dtype="bfloat16")(x)
  np.testing.assert_array_equal(np.asarray(stats16.routes), np.asarray(stats32.routes))
  assert y16.dtype == jnp.bfloat16 and stats16.aux_loss.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y16, np.float32), np.asarray(y32), atol=0.05, rtol=0.05)

"""The decoder-only network, once, for every family, and its functional API.

``Transformer`` is embedding -> ``num_layers`` family blocks (``rljax.models.families``) -> final
norm -> head. How attention reads keys is the caller's ``attend`` strategy (``layers.Attend``), so
the same module is the training and scoring forward (``self_attention``), the sampler's prefill
and decode (``rljax.models.kv_cache``) and continuous batching (``rljax.rollout.kv_blocks``).
Mixture-of-experts layers also return their routing (``MoEOut``), which router replay feeds back.

Parameters carry logical axis names (``Param(..., logical_axes=(...))``) that
``rljax.parallel`` maps onto mesh axes. The model is used functionally: ``init_params`` returns a
plain nested dict of arrays, and the functions below merge it into the module inside the traced
function, so jitted code takes and returns pytrees only.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models import attention as attention_lib
from rljax.models import families
from rljax.models import layers
from rljax.models import lora
from rljax.models.config import ModelConfig
from rljax.models import kv_cache

# ``model.remat``: what each layer keeps for the backward pass. 'full' keeps only the layer's
# input and recomputes the rest; 'dots' also keeps the outputs of the weight matmuls (2-D GEMMs:
# ``Linear`` flattens its input), so the backward recomputes only norms, RoPE, activations and
# attention, never a projection; attention's batched dots and scores are not kept.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
_ONE_HOT_EMBED_MAX_VOCAB = 1024
HEADS = ("lm", "value", "score")


class MoEOut(NamedTuple):
  """Routing of the MoE layers of one forward (rows first, so it shards like the batch).

  routes: [B, S, L_moe, k] int32, the experts each token went to in each MoE layer.
  aux_loss: scalar, the load-balancing loss averaged over the MoE layers.
  dropped: scalar int32, (token, expert) pairs dropped by capacity over all layers.
  """
  routes: jax.Array
  aux_loss: jax.Array
  dropped: jax.Array


def self_attention(cfg: ModelConfig, k_segments, aligned: bool = False) -> layers.Attend:
  """Causal self-attention over the forward's own tokens (no cache); ``k_segments`` [B, S]
  segment ids or a 0/1 mask; ``aligned``: every row's first valid slot is 0
  (``attention_lib.attention``)."""
  def attend(q, k, v, layer_cache, window):
    out = attention_lib.attention(q, k.astype(q.dtype), v.astype(q.dtype), k_segments,
                                  q_offset=k.shape[1] - q.shape[1], window=window,
                                  backend=cfg.attention, block=cfg.attention_block,
                                  aligned=aligned)
    return out, layer_cache
  return attend


class Transformer(nnx.Module):
  """Embedding, ``num_layers`` blocks of the config's family, final norm, and a head.

  ``head='lm'``: next-token logits (tied to the embedding when ``cfg.tie_embeddings``).
  ``head='value'``: a scalar value per position (the critic), no vocabulary projection.
  ``head='score'``: a scalar reward of the whole sequence (a reward model): the ``score``
  projection [D, 1] without bias of ``transformers``' ``*ForSequenceClassification`` with one
  label, read at the last real token of each row (``sequence_scores``).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, head: str = "lm"):
    if head not in HEADS:
      raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    family = families.get(cfg.model_type)
    pdt = jnp.dtype(cfg.param_dtype)
    self.cfg = cfg
    self.head = head
    self.embed_scale = cfg.hidden_size ** 0.5 if family.embed_scale else None
    self.embed_tokens = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.hidden_size), pdt),
        logical_axes=("vocab", "embed"))
    self.num_layers = cfg.num_layers
    for i in range(cfg.num_layers):
      setattr(self, f"layers_{i}", family.block(cfg, i, rngs=rngs))
    if family.tower is not None and cfg.vision is not None:
      self.visual = family.tower(cfg, rngs=rngs)  # the image encoder (rljax.vision)
    self.norm = family.final_norm(cfg.hidden_size, cfg=cfg)
    if head == "lm" and not cfg.tie_embeddings:
      self.lm_head = layers.Linear(cfg.hidden_size, cfg.vocab_size, axes=("embed", "vocab"),
                                   bias=False, cfg=cfg, rngs=rngs)
    if head == "value":
      self.value_head = layers.Linear(cfg.hidden_size, 1, axes=("embed", None), bias=True,
                                      cfg=cfg, rngs=rngs)
    if head == "score":
      self.score = layers.Linear(cfg.hidden_size, 1, axes=("embed", None), bias=False, cfg=cfg,
                                 rngs=rngs)

  def __call__(self, tokens, positions, attend: layers.Attend, cache=None, *,
               last_only: bool = False, valid=None, routes=None, rope_tables=None,
               embeds=None, deepstack=None):
    """Final-norm hidden states of ``tokens`` [B, S] at ``positions`` [B, S] (or [3, B, S]:
    M-RoPE, ``layers.rope_at``).

    ``attend``: the attention strategy (``self_attention`` for a cache-free forward); ``cache``:
    one entry per layer that ``attend`` reads and returns (None: no cache). ``last_only``: the
    last layer computes its output at the last position only (prefill: [B, 1, D] comes back).
    ``valid`` [B, S]: the real tokens (MoE load-balancing statistics); ``routes`` [B, S, L_moe,
    k]: experts to use instead of the router's choice (router replay). ``rope_tables``: the
    rotations to look up (``rope_tables``; decode steps), else computed. ``embeds`` [B, S, D]:
    the input embeddings to use instead of the tokens' (images merged in, ``rljax.vision``).
    ``deepstack`` [K, B, S, D]: added to the output of layers 0..K-1 (Qwen3-VL's DeepStack:
    image features of the tower's middle layers at the image positions, 0 elsewhere).
    Returns (hidden, new cache or None, ``MoEOut`` or None).
    """
    cfg = self.cfg
    x = self.embed(tokens, one_hot=cache is None) if embeds is None else embeds
    ropes = {}
    for spec in rope_specs(cfg):
      inv_freq = layers.rope_inv_freq(cfg.head_dim, *spec)
      ropes[spec] = (layers.rope_at(positions, inv_freq, cfg.mrope_section,
                                    cfg.mrope_interleaved)
                     if rope_tables is None or positions.ndim == 3  # M-RoPE: computed
                     else layers.rope_lookup(rope_tables[repr(spec)], positions))
    moe_layers = [i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
    if routes is not None:
      want = tokens.shape + (len(moe_layers), cfg.experts_per_token)
      if tuple(routes.shape) != want:
        raise ValueError(f"routes of shape {tuple(routes.shape)}: router replay needs [B, S, "
                         f"MoE layers, experts per token] = {want}")
    policy = REMAT_POLICIES[cfg.remat]
    if cache is None and cfg.scan_layers and not moe_layers and deepstack is None:
      if not cfg.uniform_layers:
        raise ValueError("model.scan_layers needs identical layers; this model's layers differ "
                         "in attention window or RoPE")
      x = self._scan_blocks(x, ropes[cfg.layer_rope(0)], attend, policy)
      return self.norm(x), None, None
    new_cache, stats = [], []
    for i in range(self.num_layers):
      block = getattr(self, f"layers_{i}")
      layer_cache = None if cache is None else cache[i]
      layer_routes = None if routes is None else routes[:, :, moe_layers.index(i)] \
          if i in moe_layers else None
      run = _block_call(attend, last_only and i == self.num_layers - 1)
      if policy is not None and cache is None:
        run = nnx.remat(run, policy=policy)
      x, layer_cache, layer_stats = run(block, x, ropes[cfg.layer_rope(i)], valid, layer_routes,
                                        layer_cache)
      if deepstack is not None and i < deepstack.shape[0]:
        x = x + deepstack[i][:, deepstack.shape[2] - x.shape[1]:].astype(x.dtype)
      new_cache.append(layer_cache)
      if layer_stats is not None:
        stats.append(layer_stats)
    moe_out = None
    if stats:
      moe_out = MoEOut(routes=jnp.stack([s.routes for s in stats], axis=2).astype(jnp.int32),
                       aux_loss=jnp.mean(jnp.stack([s.aux_loss for s in stats])),
                       dropped=sum(jnp.asarray(s.dropped, jnp.int32) for s in stats))
    return self.norm(x), (None if cache is None else tuple(new_cache)), moe_out

  def _scan_blocks(self, x, rope, attend, policy):
    """The blocks without a cache as one ``jax.lax.scan`` over their stacked parameters.

    ``x_{l+1} = block(x_l; W_l)`` for ``l = 0..L-1`` with ``W = stack(W_0..W_{L-1})`` built here,
    inside the traced function, so the parameter tree keeps its ``layers_i`` entries. The remat
    policy wraps the scanned body (``jax.checkpoint``): XLA cannot merge a loop body's
    recomputation back into the forward, which it does with an unrolled loop on CPU, so only
    this layout makes remat save memory there. Cost: one stacked copy of the layer weights
    during the step, and in the backward one of their gradients (unstacked into ``layers_i``).
    """
    graphdef, first = nnx.split(self.layers_0)
    states = [first] + [nnx.split(getattr(self, f"layers_{i}"))[1]
                        for i in range(1, self.num_layers)]
    stacked = jax.tree.map(lambda *ws: jnp.stack(ws), *states)

    def body(h, layer_state):
      h, _, _ = nnx.merge(graphdef, layer_state)(h, rope, attend, None)
      return h, None

    if policy is not None:
      body = jax.checkpoint(body, policy=policy)
    x, _ = jax.lax.scan(body, x, stacked)
    return x

  def embed(self, tokens, one_hot: bool = True):
    """Token embeddings [B, S, D] in the compute dtype (times ``sqrt(D)`` where the family
    scales them).

    Small vocabularies use a one-hot matmul when ``one_hot`` (differentiated forwards): its
    gradient is a GEMM, while the gather's gradient is a scatter-add, which XLA:CPU runs an
    order of magnitude slower. Both are exact.
    """
    dtype = jnp.dtype(self.cfg.dtype)
    table = self.embed_tokens[...].astype(dtype)
    if one_hot and self.cfg.vocab_size <= _ONE_HOT_EMBED_MAX_VOCAB:
      hot = jax.nn.one_hot(tokens.reshape(-1), self.cfg.vocab_size, dtype=dtype)
      x = jnp.dot(hot, table).reshape(tokens.shape + (table.shape[-1],))
    else:
      x = jnp.take(table, tokens, axis=0)
    if self.embed_scale is not None:
      x = x * jnp.asarray(self.embed_scale, dtype)
    return x

  def head_weight(self):
    """Output projection [D, V] in the compute dtype."""
    dtype = jnp.dtype(self.cfg.dtype)
    if self.head != "lm":
      raise ValueError(f"a {self.head!r} model has no vocabulary head")
    if self.cfg.tie_embeddings:
      return self.embed_tokens[...].T.astype(dtype)
    return self.lm_head.kernel[...].astype(dtype)

  def logits(self, hidden):
    return softcap(self.cfg, jnp.dot(hidden, self.head_weight()))

  def values(self, hidden):
    return self.value_head(hidden)[..., 0].astype(jnp.float32)

  def scores(self, pooled):
    """Reward [B] float32 of the pooled hidden states [B, D]."""
    return self.score(pooled)[..., 0].astype(jnp.float32)


def rope_specs(cfg: ModelConfig) -> list:
  """The distinct ``(theta, scaling)`` RoPE flavours of the layers."""
  return sorted({cfg.layer_rope(i) for i in range(cfg.num_layers)}, key=repr)


def rope_tables(cfg: ModelConfig, n_positions: int) -> dict:
  """``{repr(spec): Rope table [n_positions, Dh]}`` of every RoPE flavour of the model."""
  return {repr(spec): layers.rope_table(n_positions, layers.rope_inv_freq(cfg.head_dim, *spec))
          for spec in rope_specs(cfg)}


def _block_call(attend, last_only: bool):
  """``block(x, rope, valid, routes, layer_cache)`` with the static arguments closed over (remat
  traces every argument)."""
  def run(block, x, rope, valid, routes, layer_cache):
    return block(x, rope, attend, layer_cache, last_only=last_only, valid=valid, routes=routes)
  return run


def softcap(cfg: ModelConfig, logits):
  """``cap * tanh(logits / cap)`` where the model caps its logits (Gemma 2), else ``logits``."""
  cap = cfg.final_logit_softcap
  if cap is None:
    return logits
  return jnp.tanh(logits / cap) * cap


# --- functional API ------------------------------------------------------------------------------

def _abstract(cfg: ModelConfig, head: str):
  return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), head=head)))


def init_params(cfg: ModelConfig, seed: int = 0, head: str = "lm") -> dict:
  """Random parameters (normal, std 0.02; norms at their identity) as a nested dict of arrays.
  With adapters (``cfg.lora_rank``): the base model of the same seed, bit for bit, with fresh
  adapters (``lora.with_adapters``: A uniform, B = 0)."""
  _, state = nnx.split(Transformer(cfg.base, rngs=nnx.Rngs(seed), head=head))
  return lora.with_adapters(cfg, nnx.to_pure_dict(state), seed)


def param_shapes(cfg: ModelConfig, head: str = "lm") -> dict:
  """``jax.ShapeDtypeStruct`` for every parameter, without allocating any."""
  _, state = _abstract(cfg, head)
  shapes = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), nnx.to_pure_dict(state))
  return lora.cast_base(cfg, shapes)


def logical_axes(cfg: ModelConfig, head: str = "lm") -> dict:
  """Logical axis names of every parameter, same tree as ``init_params``."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), head=head))
  axes = {}
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Variable):
      tree = axes
      for key in path[:-1]:
        tree = tree.setdefault(key, {})
      tree[path[-1]] = node.get_metadata()["logical_axes"]
  return axes


def bind(cfg: ModelConfig, params: dict, head: str = "lm") -> Transformer:
  """The module with ``params`` in it; call inside traced code (no copy is made)."""
  graphdef, _ = _abstract(cfg, head)
  return nnx.merge(graphdef, params)


def positions_from_mask(mask):
  """Position ids [B, S] of rows of segment ids (``attention_lib``'s module doc; a 0/1 mask is
  one segment): each segment's tokens count 0, 1, .. from its first token, as if its sequence
  were alone: ``cumsum(valid) - 1`` minus the valid tokens before the segment. Padding takes
  the count so far (0 before the first token): ``cumsum(mask) - 1`` on a 0/1 mask."""
  segments = attention_lib.as_segments(mask)
  valid = (segments > 0).astype(jnp.int32)
  count = jnp.cumsum(valid, axis=-1)
  before = jnp.pad(jax.lax.cummax(segments, axis=1)[:, :-1], ((0, 0), (1, 0)))
  starts = (segments > 0) & (segments != before)
  # Valid tokens before each slot's segment: the count just before its latest start.
  base = jax.lax.cummax(jnp.where(starts, count - 1, 0), axis=1)
  return jnp.maximum(count - base - 1, 0)


def forward_with_routes(cfg: ModelConfig, params: dict, tokens, attn_mask, head: str = "lm",
                        routes=None):
  """Full causal forward of rows of tokens [B, S]: (hidden [B, S, D] after the final norm, the
  module, ``MoEOut`` or None). ``attn_mask`` [B, S]: segment ids (0 padding, 1..n the sequences
  packed into the row as contiguous runs in increasing order; ``attention_lib``'s module doc),
  or a 0/1 mask (one sequence per row, e.g. left-padded). Each segment is computed as if its
  sequence were alone: positions restart at 0 and attention stays within it. ``routes``: replay
  these experts (``Transformer.__call__``).

  Where the attention kernel wants padding at the end of the rows (cuDNN,
  ``attention_lib.aligns_rows``), the rows are rotated once here, before the embedding, and the
  outputs back after the final norm: exact (positions travel with their tokens, and rotation
  keeps the order of each row's segments and the distances within them)."""
  model = bind(cfg, params, head)
  segments = attention_lib.as_segments(attn_mask)
  positions = positions_from_mask(segments)
  aligned = attention_lib.aligns_rows(cfg.attention, cfg.dtype)
  if aligned:
    first = attention_lib.first_valid(segments)
    tokens, positions, segments = (attention_lib.rotate_rows(x, first)
                                   for x in (tokens, positions, segments))
    routes = None if routes is None else attention_lib.rotate_rows(routes, first)
  hidden, _, moe = model(tokens, positions, self_attention(cfg, segments, aligned),
                         valid=segments > 0, routes=routes)
  if aligned:
    hidden = attention_lib.rotate_rows(hidden, -first)
    if moe is not None:
      moe = moe._replace(routes=attention_lib.rotate_rows(moe.routes, -first))
  return hidden, model, moe


def forward(cfg: ModelConfig, params: dict, tokens, attn_mask, head: str = "lm"):
  """Full causal forward of rows with a 0/1 mask or segment ids (``forward_with_routes``):
  hidden [B, S, D] after the final norm."""
  return forward_with_routes(cfg, params, tokens, attn_mask, head)[0]


def logits(cfg: ModelConfig, params: dict, tokens, attn_mask):
  """Full causal forward returning logits [B, S, V] (tests and small models only)."""
  hidden, model, _ = forward_with_routes(cfg, params, tokens, attn_mask)
  return model.logits(hidden)


def last_valid_index(attn_mask):
  """Index [B] of the last real token of each row of ``attn_mask`` [B, S]: ``S - 1 - argmax``
  over the reversed mask, whatever the padding (left-padded prompts, right-padded completions)."""
  width = attn_mask.shape[-1]
  return width - 1 - jnp.argmax(attn_mask[:, ::-1].astype(jnp.int32), axis=-1)


def scored_index(tokens, attn_mask, pad_token_id):
  """Index [B] of the token each row of ``tokens`` [B, S] is scored at: its last real token
  (``attn_mask``) that is not ``pad_token_id``, where ``transformers``' ``*ForSequenceClassification``
  pools (its last token that is not ``pad_token_id``, on rows padded with that id). A tokenizer
  without a pad token pads with EOS (``HFTokenizer.pad_id``): a row ending in EOS is then scored
  at the token before it, as ``transformers`` scores the export. A row whose every real token is
  the padding id is scored at its last real token; ``pad_token_id`` None: the last real token."""
  real = attn_mask.astype(bool)
  if pad_token_id is not None:
    kept = real & (tokens != pad_token_id)
    real = jnp.where(kept.any(axis=-1, keepdims=True), kept, real)
  return last_valid_index(real)


def sequence_scores(cfg: ModelConfig, params: dict, tokens, attn_mask):
  """Reward-model scores [B] float32 of rows ``tokens`` [B, S] (``attn_mask`` marks the real
  tokens): ``r = h[b, last(b)] . w_score``, the final-norm hidden state at each row's scored
  token (``scored_index``: its last real token that is not ``cfg.pad_token_id``, where
  ``transformers`` pools) times the ``score`` head. ``params`` of ``head='score'``."""
  hidden, model, _ = forward_with_routes(cfg, params, tokens, attn_mask, head="score")
  last = scored_index(tokens, attn_mask, cfg.pad_token_id)
  pooled = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
  return model.scores(pooled)


def head_weight(cfg: ModelConfig, params: dict):
  """The [D, V] output projection (for chunked log-probs that never build [B, T, V])."""
  return bind(cfg, params).head_weight()


def init_cache(cfg: ModelConfig, batch: int, slots: int):
  """The sampler's zeroed KV cache (``rljax.models.kv_cache``) for ``batch`` rows of ``slots``."""
  return kv_cache.init_cache(cfg, batch, slots)


def cached_step(cfg: ModelConfig, params: dict, tokens, positions, cache, cache_index, kv_mask):
  """Prefill (``cache_index`` 0, S > 1) or decode (S = 1) through the KV cache: the S new tokens
  are written at slots ``cache_index ..`` and attend to the slots marked in ``kv_mask`` [B, K]
  up to their own. Returns (hidden [B, S, D], new cache)."""
  attend = kv_cache.attend_at(cfg, cache_index, kv_mask.astype(bool), tokens.shape[1])
  hidden, cache, _ = bind(cfg, params)(tokens, positions, attend, cache)
  return hidden, cache

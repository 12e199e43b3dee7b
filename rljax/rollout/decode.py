"""The sampler's forward: the model (``rljax.models.transformer``) run through a KV cache, with
its weights laid out for inference once per ``sample`` call.

- ``inference_params``: every weight in the compute dtype, and the q/k/v projections and the
  gate/up projections each one matmul (``ModelConfig.fused_qkv`` / ``fused_mlp``), except on
  CPU where a fused kernel would exceed ``CPU_MAX_FUSED_KERNEL_BYTES``;
- ``step``: prefill (S = P) or decode (S = 1) through the head-major cache
  (``rljax.models.kv_cache``) or a caller's cache layout (continuous batching's blocks); the
  last layer of a prefill computes its output at the last prompt position only (its keys and
  values go to the cache for every position), so ``[B, S, V]`` logits are never formed.

The tests check the sampler's log-probs against a teacher-forced forward and its greedy tokens
against ``transformers``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rljax.models import kv_cache, transformer
from rljax.models.config import ModelConfig

# On the CPU backend a matmul whose kernel exceeds about this many bytes runs at about half the
# FLOP/s of smaller ones (XLA:CPU's matmul library, measured for the few rows a decode step has:
# [16, 128] @ [128, 512] 224 GFLOP/s, @ [128, 1024] 116 GFLOP/s on one EPYC core). Projections are
# fused into one matmul only while the fused kernel stays within it; elsewhere always.
CPU_MAX_FUSED_KERNEL_BYTES = 256 << 10
# The backends that this CPU tuning (and the sampler's cache blocking) applies to; the tests add
# the backend they run on, to exercise those paths on any machine.
CPU_TUNED_BACKENDS = ("cpu",)


def _fuse(widths: list[int], cfg: ModelConfig) -> bool:
  """Whether projections of these output widths (from D) become one kernel."""
  fused_bytes = cfg.hidden_size * sum(widths) * jnp.dtype(cfg.dtype).itemsize
  return not (jax.default_backend() in CPU_TUNED_BACKENDS
              and fused_bytes > CPU_MAX_FUSED_KERNEL_BYTES)


def _concat(modules: list[dict]) -> dict:
  out = {"kernel": jnp.concatenate([m["kernel"] for m in modules], axis=-1)}
  if modules[0].get("bias") is not None:
    out["bias"] = jnp.concatenate([m["bias"] for m in modules], axis=-1)
  return out


def inference_params(cfg: ModelConfig, params: dict) -> tuple[ModelConfig, dict]:
  """``(cfg, params)`` of the same model laid out for decoding: weights in the compute dtype
  (norm scales keep theirs: they are applied in float32), q/k/v and gate/up fused where it pays
  (``_fuse``). Call once per ``sample``, outside the decode loops."""
  h, g, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  fused_qkv = _fuse([h * dh, g * dh, g * dh], cfg)
  fused_mlp = _fuse([2 * cfg.intermediate_size], cfg) and not cfg.moe_layers
  dtype = jnp.dtype(cfg.dtype)
  cast = lambda path, x: x if path[-1].key == "scale" else x.astype(dtype)
  params = jax.tree_util.tree_map_with_path(cast, params)
  params = dict(params)
  for i in range(cfg.num_layers):
    layer = dict(params[f"layers_{i}"])
    if fused_qkv:
      attn = dict(layer["self_attn"])
      attn["qkv_proj"] = _concat([attn.pop(f"{n}_proj") for n in "qkv"])
      layer["self_attn"] = attn
    if fused_mlp:
      mlp = dict(layer["mlp"])
      mlp["gate_up_proj"] = _concat([mlp.pop("gate_proj"), mlp.pop("up_proj")])
      layer["mlp"] = mlp
    params[f"layers_{i}"] = layer
  # MoE layers decode dropless (every routed token reaches its experts, as vLLM does): a
  # capacity would depend on how many rows happen to decode together. Dense rather than sparse:
  # at the few rows of a decode step the sparse dispatch's blocks are small and its kernel
  # gathers cost more than the dense FLOPs they save on XLA:CPU (benchmarks/RESULTS.md).
  return cfg.replace(fused_qkv=fused_qkv, fused_mlp=fused_mlp, moe_dispatch="dense"), params


def inference_weights(cfg: ModelConfig, params: dict, n_positions: int
                      ) -> tuple[ModelConfig, dict]:
  """``(cfg, weights)`` for ``step``: ``params`` laid out by ``inference_params``, the output
  head [D, V] and the RoPE tables of positions below ``n_positions``."""
  cfg, params = inference_params(cfg, params)
  return cfg, dict(params=params, head=transformer.head_weight(cfg, params),
                   rope=transformer.rope_tables(cfg, n_positions))


def step(cfg: ModelConfig, weights: dict, tokens, positions, cache, slot, kv_valid, attend=None,
         embeds=None, all_positions: bool = False, deepstack=None):
  """Feed ``S`` tokens per row at cache slots ``slot .. slot+S-1``: prefill (S = P), decode
  (S = 1) or a speculative verification (S = k + 1, ``all_positions``). Returns (final-norm
  hidden of the *last* token [B, D], or of every token [B, S, D] with ``all_positions``, cache,
  routes): ``routes``
  [B, S, L_moe, k] the experts each fed token went to in each MoE layer (None for a dense
  model; router replay R3 trains with them).

  ``cfg``/``weights`` from ``inference_weights``. tokens, positions: [B, S] int. cache: the
  head-major cache (``kv_cache.init_cache``). kv_valid: [B, K] bool, the slots a query may attend
  to (prompt tokens and completion slots), each query only up to its own slot. ``slot``: one int
  for every row, or a [B] int array (every row writes at its own slot).

  ``attend``: None, or the attention strategy of a cache of another layout
  (``rljax.models.layers.Attend``: it writes ``k, v`` and attends; continuous batching's cache
  blocks, one token per row; the multi-turn store of ``rljax.rollout.turns``, which also
  prefills chunks of ``S`` tokens into a cache that already holds earlier ones); ``slot`` and
  ``kv_valid`` are then unused. ``embeds`` [B, S, D]: input embeddings instead of the tokens'
  (a prompt with images, ``rljax.vision.multimodal``), with M-RoPE ``positions`` [3, B, S];
  ``deepstack`` [K, B, S, D]: Qwen3-VL's additions to the first layers' outputs.
  """
  s = tokens.shape[1]
  if attend is None:
    attend = kv_cache.attend_at(cfg, slot, kv_valid, s)
  model = transformer.bind(cfg, weights["params"])
  # A prefill computes the last layer at every position only when its routes are recorded.
  hidden, cache, moe = model(tokens, positions, attend, cache,
                             last_only=s > 1 and not cfg.moe_layers and not all_positions,
                             rope_tables=weights["rope"], embeds=embeds, deepstack=deepstack)
  return (hidden if all_positions else hidden[:, -1]), cache, None if moe is None else moe.routes


def logits_of(cfg: ModelConfig, weights: dict, hidden):
  """Next-token logits [.., V] in float32 of final-norm ``hidden`` [.., D]."""
  return transformer.softcap(cfg, jnp.dot(hidden, weights["head"],
                                          preferred_element_type=jnp.float32))

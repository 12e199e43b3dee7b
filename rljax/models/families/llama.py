"""Llama 1-3, Mistral and Qwen2: pre-norm blocks, SwiGLU, RMSNorm ``w * x``.

``x += attn(norm1(x)); x += mlp(norm2(x))``. Qwen2 has q/k/v biases; Mistral a sliding window on
every layer. ``PreNormBlock`` is also Qwen3's block (with q/k norms and, for Qwen3-MoE, the
expert MLP).
"""
from __future__ import annotations

from flax import nnx

from rljax.models import layers
from rljax.models.config import ModelConfig
from rljax.models.families import (Family, common_from_hf, common_to_hf, dense_tensors,
                                   register_family)
from rljax.models import moe


class PreNormBlock(nnx.Module):

  def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, qk_norm: bool = False):
    self.input_layernorm = layers.RMSNorm(cfg.hidden_size, cfg=cfg)
    self.self_attn = layers.Attention(cfg, layer, rngs=rngs, qk_norm=qk_norm)
    self.post_attention_layernorm = layers.RMSNorm(cfg.hidden_size, cfg=cfg)
    self.moe = cfg.is_moe_layer(layer)
    if self.moe:
      self.mlp = moe.MoE(
          hidden_size=cfg.hidden_size, moe_intermediate_size=cfg.moe_intermediate_size,
          num_experts=cfg.num_experts, experts_per_token=cfg.experts_per_token,
          norm_topk_prob=cfg.norm_topk_prob, param_dtype=cfg.param_dtype, dtype=cfg.dtype,
          rngs=rngs, dispatch=cfg.moe_dispatch, capacity_factor=cfg.moe_capacity_factor,
          lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets)
    else:
      self.mlp = layers.GatedMLP(cfg, rngs=rngs)

  def __call__(self, x, rope, attend, layer_cache, *, last_only=False, valid=None, routes=None):
    attn, layer_cache = self.self_attn(self.input_layernorm(x), rope, attend, layer_cache,
                                       last_only)
    x = layers.residual(x, attn)
    h = self.post_attention_layernorm(x)
    if self.moe:
      valid = None if valid is None else valid[:, valid.shape[1] - x.shape[1]:]
      out, stats = self.mlp(h, valid, routes)
      return x + out, layer_cache, stats
    return x + self.mlp(h), layer_cache, None


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM"}


def config_from_hf(hf) -> dict:
  model_type = hf["model_type"]
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU)")
  if model_type == "qwen2" and hf.get("use_sliding_window"):
    raise ValueError("Qwen2 with use_sliding_window=True is not supported")
  # Mistral applies its window to every layer (``transformers`` MistralAttention); Llama has
  # none, and Qwen2's per-layer windows are refused above.
  window = hf.get("sliding_window") if model_type == "mistral" else None
  bias = bool(hf.get("attention_bias", False))
  return dict(common_from_hf(hf), qkv_bias=model_type == "qwen2" or bias,
              o_bias=model_type != "qwen2" and bias, mlp_bias=bool(hf.get("mlp_bias", False)),
              sliding_window=None if window is None else int(window))


def config_to_hf(cfg: ModelConfig) -> dict:
  hf = dict(common_to_hf(cfg, _ARCHITECTURES[cfg.model_type]), hidden_act="silu")
  if cfg.model_type == "qwen2":
    hf["use_sliding_window"] = False
  if cfg.model_type == "mistral":
    hf["sliding_window"] = cfg.sliding_window  # None: full attention (transformers' reading)
  else:
    hf["attention_bias"] = cfg.qkv_bias
    hf["mlp_bias"] = cfg.mlp_bias
  return hf


register_family(Family(
    name="llama", model_types=tuple(_ARCHITECTURES), block=PreNormBlock,
    final_norm=lambda dim, cfg: layers.RMSNorm(dim, cfg=cfg), config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, layer_tensors=lambda cfg, layer: dense_tensors(cfg)))

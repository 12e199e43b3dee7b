"""Gemma 3 (text, ``gemma3_text``): sandwich norms, GeGLU, scaled embeddings, local and global
attention layers.

``x += norm2(attn(norm1(x))); x += norm4(mlp(norm3(x)))`` with every RMSNorm Gemma's
``(1 + w)`` scaled in float32; q/k RMSNorm per head before RoPE; scores scaled by
``query_pre_attn_scalar ** -0.5``; embeddings times ``sqrt(hidden_size)``; ``layer_types`` says
which layers attend within ``sliding_window`` (RoPE base ``rope_local_base_freq``) and which
globally (``rope_theta``, with its scaling). Final logit soft-capping where the config has one.
"""
from __future__ import annotations

from flax import nnx

from rljax.models import layers
from rljax.models.config import ModelConfig
from rljax.models.families import (Family, common_from_hf, common_to_hf, dense_tensors,
                                   parse_rope, register_family, rope_to_hf)

_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm")


class SandwichBlock(nnx.Module):

  def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
    for name in _NORMS:
      setattr(self, name, layers.RMSNorm(cfg.hidden_size, cfg=cfg, offset=True))
    self.self_attn = layers.Attention(cfg, layer, rngs=rngs, qk_norm=True, norm_offset=True)
    self.mlp = layers.GatedMLP(cfg, rngs=rngs)

  def __call__(self, x, rope, attend, layer_cache, *, last_only=False, valid=None, routes=None):
    attn, layer_cache = self.self_attn(self.input_layernorm(x), rope, attend, layer_cache,
                                       last_only)
    x = layers.residual(x, self.post_attention_layernorm(attn))
    x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
    return x, layer_cache, None


def _layer_types(hf) -> tuple:
  if hf.get("layer_types"):
    return tuple(hf["layer_types"])
  pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
  return tuple("sliding_attention" if (i + 1) % pattern else "full_attention"
               for i in range(hf["num_hidden_layers"]))


def config_from_hf(hf) -> dict:
  act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
  if act != "gelu_pytorch_tanh":
    raise ValueError(f"unsupported hidden_activation={act!r}; only 'gelu_pytorch_tanh' (GeGLU)")
  if hf.get("attn_logit_softcapping") is not None:
    raise ValueError("Gemma with attn_logit_softcapping is not supported (Gemma 3 has none)")
  if hf.get("use_bidirectional_attention"):
    raise ValueError("Gemma with use_bidirectional_attention=True is not a causal LM")
  rope = hf.get("rope_parameters") or {}
  if "full_attention" in rope:  # transformers >= 5: one entry per layer type
    theta, scaling = parse_rope(rope["full_attention"], hf.get("rope_theta", 1e6))
    local_theta, local_scaling = parse_rope(rope.get("sliding_attention"),
                                            hf.get("rope_local_base_freq", 1e4))
  else:
    theta, scaling = parse_rope(hf.get("rope_scaling"), hf.get("rope_theta", 1e6))
    local_theta, local_scaling = float(hf.get("rope_local_base_freq", 1e4)), None
  if local_scaling is not None:
    raise ValueError("rope scaling on Gemma's sliding layers is not supported")
  bias = bool(hf.get("attention_bias", False))
  cap = hf.get("final_logit_softcapping")
  hf = dict(hf, rope_parameters=None, rope_scaling=None,
            tie_word_embeddings=hf.get("tie_word_embeddings", True))
  return dict(common_from_hf(hf), rope_theta=theta, rope_scaling=scaling,
              rope_local_theta=local_theta, layer_types=_layer_types(hf),
              sliding_window=hf.get("sliding_window"), hidden_act=act, qkv_bias=bias,
              o_bias=bias, query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256),
              final_logit_softcap=None if cap is None else float(cap))


def config_to_hf(cfg: ModelConfig) -> dict:
  hf = common_to_hf(cfg, "Gemma3ForCausalLM")
  # No local base (a tiny model's): the sliding layers use rope_theta, written out so that the
  # config reads back (transformers and config_from_hf need a number there).
  local = cfg.rope_theta if cfg.rope_local_theta is None else cfg.rope_local_theta
  hf.update(
      hidden_activation=cfg.hidden_act, query_pre_attn_scalar=cfg.query_pre_attn_scalar,
      sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types),
      rope_local_base_freq=local,
      rope_parameters={"full_attention": rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
                       "sliding_attention": rope_to_hf(local, None)},
      final_logit_softcapping=cfg.final_logit_softcap, attn_logit_softcapping=None,
      attention_bias=cfg.qkv_bias, use_bidirectional_attention=False)
  return hf


FAMILY = register_family(Family(
    name="gemma3", model_types=("gemma3_text",), block=SandwichBlock,
    final_norm=lambda dim, cfg: layers.RMSNorm(dim, cfg=cfg, offset=True),
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    layer_tensors=lambda cfg, layer: dense_tensors(cfg, qk_norm=True, extra_norms=_NORMS[2:]),
    embed_scale=True,
    # Gemma3ForSequenceClassification is the image-text model's; the text model's is this one.
    classifiers={"gemma3_text": "Gemma3TextForSequenceClassification"},
    tiny_fields=lambda model_section, fields: dict(hidden_act="gelu_pytorch_tanh",
                                                   query_pre_attn_scalar=fields["head_dim"])))

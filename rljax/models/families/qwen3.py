"""Qwen3 and Qwen3-MoE: Llama's pre-norm block with a per-head RMSNorm on queries and keys before
RoPE and no q/k/v bias; Qwen3-MoE replaces the MLP of its sparse layers by the expert block
(``rljax.models.moe``: router, top-k experts, the config's ``norm_topk_prob``).
"""
from __future__ import annotations

import functools

from rljax.models import layers
from rljax.models.config import ModelConfig
from rljax.models.families import (Family, common_from_hf, common_to_hf, dense_tensors,
                                   register_family)
from rljax.models.families.llama import PreNormBlock
from rljax.models.config import _TINY_MOE

_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def _num_experts(hf) -> int:
  # transformers >= 5 writes num_local_experts, earlier versions num_experts.
  return int(hf.get("num_experts") or hf.get("num_local_experts") or 0)


def moe_layers_of(hf) -> tuple:
  """``transformers``' rule: layer ``i`` is sparse unless in ``mlp_only_layers``, every
  ``decoder_sparse_step``-th layer, when there are experts."""
  experts = _num_experts(hf)
  step = hf.get("decoder_sparse_step", 1) or 1
  dense = set(hf.get("mlp_only_layers") or ())
  return tuple(i for i in range(hf["num_hidden_layers"])
               if experts > 0 and i not in dense and (i + 1) % step == 0)


def config_from_hf(hf) -> dict:
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU)")
  if hf.get("use_sliding_window"):
    raise ValueError(f"{hf['model_type']} with use_sliding_window=True is not supported")
  bias = bool(hf.get("attention_bias", False))
  out = dict(common_from_hf(hf), qkv_bias=bias, o_bias=bias)
  if hf["model_type"] == "qwen3_moe":
    out.update(num_experts=_num_experts(hf), experts_per_token=hf["num_experts_per_tok"],
               moe_intermediate_size=hf["moe_intermediate_size"],
               norm_topk_prob=bool(hf.get("norm_topk_prob", False)), moe_layers=moe_layers_of(hf),
               router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.0)))
  return out


def config_to_hf(cfg: ModelConfig) -> dict:
  hf = dict(common_to_hf(cfg, _ARCHITECTURES[cfg.model_type]), hidden_act="silu",
            attention_bias=cfg.qkv_bias, use_sliding_window=False, sliding_window=None)
  if cfg.model_type == "qwen3_moe":
    hf.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
              moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
              decoder_sparse_step=1,
              mlp_only_layers=[i for i in range(cfg.num_layers) if not cfg.is_moe_layer(i)],
              router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False)
  return hf


def layer_tensors(cfg: ModelConfig, layer: int) -> dict:
  out = dense_tensors(cfg, qk_norm=True)
  if cfg.is_moe_layer(layer):
    out = {k: v for k, v in out.items() if not k.startswith("mlp.")}
    out["mlp.gate.weight"] = (("mlp", "router", "kernel"), True, None)
    for e in range(cfg.num_experts):
      for p in ("gate", "up", "down"):
        out[f"mlp.experts.{e}.{p}_proj.weight"] = (("mlp", f"{p}_proj"), True, e)
  return out


def tiny_fields(model_section, fields) -> dict:
  if fields["model_type"] != "qwen3_moe":
    return {}
  m = model_section
  return dict(_TINY_MOE, num_experts=m.num_experts, experts_per_token=m.experts_per_token,
              moe_intermediate_size=m.moe_intermediate_size,
              moe_layers=tuple(range(fields["num_layers"])))


register_family(Family(
    name="qwen3", model_types=tuple(_ARCHITECTURES),
    block=functools.partial(PreNormBlock, qk_norm=True),
    final_norm=lambda dim, cfg: layers.RMSNorm(dim, cfg=cfg), config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, layer_tensors=layer_tensors, tiny_fields=tiny_fields))

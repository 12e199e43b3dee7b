"""Model families: per HF ``model_type``, the blocks that differ and how config.json and the tensor
names map onto rljax (``Family``). Adding a family is one file in this package that calls
``register_family`` (``MODEL_FAMILIES`` of ``rljax.registries``: every module of this package is
imported the first time it is read, so a family registers itself by existing); the network
(``rljax.models.transformer``), the sampler, the trainer, import and export and ``rljax plan``
take everything else from the record.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from rljax.registries import MODEL_FAMILIES

# HF tensor name (within ``model.layers.{i}.``) -> (rljax path within ``layers_i``, transpose,
# expert index or None). Stacked expert weights take one HF tensor per expert.
TensorMap = dict


@dataclasses.dataclass(frozen=True)
class Family:
  """One family's definition.

  block: ``block(cfg, layer, rngs=...)`` -> an NNX module called as ``block(x, rope, attend,
    layer_cache, last_only=, valid=, routes=)`` -> ``(x, layer_cache, moe_stats or None)``.
  final_norm: ``final_norm(dim, cfg=cfg)`` -> the norm after the last block.
  embed_scale: whether embeddings are multiplied by ``sqrt(hidden_size)`` (Gemma).
  config_from_hf: HF config dict -> ``ModelConfig`` keyword arguments.
  config_to_hf: ``ModelConfig`` -> HF config dict (``transformers`` loads it as the same model).
  layer_tensors: ``layer_tensors(cfg, layer)`` -> ``TensorMap`` of that layer.
  tiny_fields: ``tiny_fields(model section, fields)`` -> the ``ModelConfig`` fields a fresh
    'tiny' model of this family sets beyond the common ``fields`` (``config.tiny_config``).
  classifiers: ``model_type`` -> the ``transformers`` class of its sequence classifier (a reward
    model's export) where that is not the causal LM's with ``ForSequenceClassification``
    (``classifier_architecture``).
  tower: ``tower(cfg, rngs=...)`` -> the module that encodes images (the network's ``visual``
    entry) where ``cfg.vision`` is set; None: a text-only family.
  extra_tensors: ``extra_tensors(cfg)`` -> ``TensorMap`` of full HF names beyond the decoder's (a
    tower's).
  rename: a checkpoint's tensor name -> the name the export writes (``transformers`` versions
    name some families' tensors differently; the identity for most).
  export_name: a name of ``tensor_names`` -> the name the export writes where ``transformers``
    writes another (Gemma 3 with images: ``language_model.model.*``); the identity for most.
  run_images: whether a run (``rljax train``) poses image prompts to it (``rljax.data.images``
    encodes its placeholders and runs its image processor); False: images through the Python
    API only (``rljax.vision.multimodal``), and a run treats the model as text-only.
  ignored: whether a checkpoint's tensor is one the family never reads (skipped on load, never
    exported; SigLIP's pooling head in Gemma 3).
  module_name: a name the export writes -> the tensor's name in the ``transformers`` model's
    module tree (what PEFT names adapters by), where the two differ (``transformers`` renames
    some checkpoints on load); ``rename`` maps it back. The identity for most.
  """
  name: str
  model_types: tuple
  block: Callable
  final_norm: Callable
  config_from_hf: Callable[[Mapping[str, Any]], dict]
  config_to_hf: Callable
  layer_tensors: Callable
  embed_scale: bool = False
  tiny_fields: Callable = lambda model_section, fields: {}
  classifiers: Mapping[str, str] = dataclasses.field(default_factory=dict)
  tower: Callable | None = None
  extra_tensors: Callable = lambda cfg: {}
  rename: Callable[[str], str] = lambda name: name
  export_name: Callable[[str], str] = lambda name: name
  ignored: Callable[[str], bool] = lambda name: False
  run_images: bool = True
  module_name: Callable[[str], str] = lambda name: name


def register_family(family: Family) -> Family:
  """Registers ``family`` under each of its HF ``model_type``s; its registration states whether
  it has a ``tower`` and whether a run poses it ``images`` (a tower, and ``run_images``), which
  the config check reads."""
  for model_type in family.model_types:
    MODEL_FAMILIES.register(model_type, images=family.tower is not None and family.run_images,
                            tower=family.tower is not None)(family)
  return family


def model_types() -> tuple[str, ...]:
  return tuple(MODEL_FAMILIES.names())


def get(model_type: str) -> Family:
  return MODEL_FAMILIES.get(model_type)


def classifier_architecture(model_type: str, causal_lm: str) -> str:
  """The ``*ForSequenceClassification`` class ``transformers`` loads a reward model of
  ``model_type`` with, given its causal LM's class ``causal_lm``."""
  named = get(model_type).classifiers.get(model_type)
  return named or causal_lm.replace("ForCausalLM", "ForSequenceClassification")


# --- config.json keys the families share ---------------------------------------------------------

def parse_rope(rope: Mapping | None, default_theta: float) -> tuple[float, tuple | None]:
  """``(theta, scaling)`` of an HF rope entry (``rope_parameters`` of transformers >= 5, or
  ``rope_scaling`` of earlier versions, whose theta is the top-level ``rope_theta``)."""
  rope = dict(rope or {})
  theta = rope.pop("rope_theta", default_theta)
  if "type" in rope and "rope_type" not in rope:
    rope["rope_type"] = rope.pop("type")
  kind = rope.get("rope_type", "default")
  if kind != "default" and "factor" not in rope:
    raise ValueError(f"rope scaling {kind!r} needs a 'factor'")
  return float(theta), None if kind == "default" else tuple(sorted(rope.items()))


def common_from_hf(hf: Mapping[str, Any]) -> dict:
  """The ``ModelConfig`` fields every family reads the same way."""
  heads = hf["num_attention_heads"]
  theta, scaling = parse_rope(hf.get("rope_parameters") or hf.get("rope_scaling"),
                              hf.get("rope_theta", 10000.0))
  return dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_position_embeddings=hf.get("max_position_embeddings", 4096),
      model_type=hf["model_type"], bos_token_id=hf.get("bos_token_id"),
      eos_token_id=hf.get("eos_token_id"), pad_token_id=hf.get("pad_token_id"))


def rope_to_hf(theta: float, scaling: tuple | None) -> dict:
  rope = {"rope_theta": theta, "rope_type": "default"}
  rope.update(dict(scaling or ()))
  return rope


def common_to_hf(cfg, architecture: str) -> dict:
  eos = cfg.eos_token_id
  return dict(
      architectures=[architecture], model_type=cfg.model_type, vocab_size=cfg.vocab_size,
      hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
      rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
      rope_parameters=rope_to_hf(cfg.rope_theta, cfg.rope_scaling),
      rope_scaling=None if cfg.rope_scaling is None else cfg.rope_dict,
      tie_word_embeddings=cfg.tie_embeddings,
      max_position_embeddings=cfg.max_position_embeddings, torch_dtype=cfg.param_dtype,
      bos_token_id=cfg.bos_token_id,
      eos_token_id=list(eos) if isinstance(eos, tuple) else eos, pad_token_id=cfg.pad_token_id)


def dense_tensors(cfg, *, qk_norm: bool = False, extra_norms: tuple = ()) -> TensorMap:
  """The tensors of a layer with attention and a dense gated MLP (Llama naming)."""
  out = {f"{n}.weight": ((n, "scale"), False, None)
         for n in ("input_layernorm", "post_attention_layernorm") + extra_norms}
  for p in "qkvo":
    out[f"self_attn.{p}_proj.weight"] = (("self_attn", f"{p}_proj", "kernel"), True, None)
    out[f"self_attn.{p}_proj.bias"] = (("self_attn", f"{p}_proj", "bias"), False, None)
  if qk_norm:
    for p in "qk":
      out[f"self_attn.{p}_norm.weight"] = (("self_attn", f"{p}_norm", "scale"), False, None)
  for p in ("gate", "up", "down"):
    out[f"mlp.{p}_proj.weight"] = (("mlp", f"{p}_proj", "kernel"), True, None)
    out[f"mlp.{p}_proj.bias"] = (("mlp", f"{p}_proj", "bias"), False, None)
  return out

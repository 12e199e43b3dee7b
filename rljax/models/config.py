"""Model configuration of every supported family, read from (and written back to) HF config.json.

The fields are the union of what the families need; each family file (``rljax/models/families``)
says which HF keys fill them (``config_from_hf``) and how they are written back (``config_to_hf``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Mapping

import jax

from rljax.config.table import KEY_BY_NAME, REMAT_MODES, options
from rljax.errors import ConfigError, ModelFileError
from rljax.models import families, lora

# The run settings' choices, as ``rljax/config/table.py`` declares the keys.
MATMUL_PRECISIONS = options("model.matmul_precision")
REMAT_CHOICES = REMAT_MODES
ATTENTION_BACKENDS = options("model.attention")
# What a checkpoint's architecture may be (config.json), beside the keys.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
LAYER_TYPES = ("full_attention", "sliding_attention")
HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")
# The fields a run sets from its ``model`` section, checked against the keys' declarations.
DECLARED_FIELDS = ("remat", "scan_layers", "attention", "attention_block", "moe_dispatch",
                   "moe_capacity_factor", "router_replay")


def _check_declared(key: str, value) -> None:
  """``value`` against the declaration of the config key ``key`` (rljax/config/sections/):
  a ModelConfig built by hand is held to what ``--config`` allows."""
  allowed = KEY_BY_NAME[key].check(value)
  if allowed is not None:
    raise ConfigError(f"{key}={value!r} is not allowed: expected {allowed}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a decoder-only transformer, named as ``transformers`` names them.

  ``rope_scaling`` is a sorted tuple of ``(key, value)`` pairs so the config stays hashable (it is
  a static argument of jitted functions). ``model_type`` selects the family
  (``rljax.models.families``): the blocks that differ between families live there.
  """
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: tuple | None = None
  tie_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  max_position_embeddings: int = 4096
  model_type: str = "llama"
  bos_token_id: int | None = None
  eos_token_id: int | list | None = None
  pad_token_id: int | None = None
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  remat: str = "none"  # 'none' | 'full' | 'dots' (True/False of old configs: 'full'/'none')
  scan_layers: bool = False  # cache-free forward as a lax.scan over stacked layer weights
  attention: str = "auto"  # backend of rljax.models.attention
  attention_block: int = 128  # max query/key block of the blockwise backend (balanced)
  sliding_window: int | None = None  # a query sees its last ``sliding_window`` slots
  # Per-layer attention ('full_attention' | 'sliding_attention'), None: every layer alike (the
  # window, if any, on all of them). Sliding layers use ``rope_local_theta`` when it is set.
  layer_types: tuple | None = None
  rope_local_theta: float | None = None
  hidden_act: str = "silu"
  query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power, not Dh's
  final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
  # Mixture of experts (0 experts: a dense MLP in every layer).
  num_experts: int = 0
  experts_per_token: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  moe_layers: tuple = ()  # indices of the layers whose MLP is the MoE block
  router_aux_loss_coef: float = 0.0
  moe_dispatch: str = "sparse"
  moe_capacity_factor: float = 1.25
  router_replay: str = "off"  # 'off' | 'R2' | 'R3' (``model.router_replay``)
  # The sampler's layout of the projections (``rljax.rollout.decode.inference_params``): q/k/v
  # as one kernel, gate/up as one kernel. The parameter tree of a model follows them.
  fused_qkv: bool = False
  fused_mlp: bool = False
  # Low-rank adapters (``rljax.models.lora``; ``model.lora.*``): rank 0 is none (the parameter
  # tree and the forward are the base model's). ``lora_targets``: projection names (``'all'``
  # expands to every one); ``lora_base_dtype``: the frozen base's dtype (None: ``param_dtype``).
  lora_rank: int = 0
  lora_alpha: float = 32.0
  lora_targets: tuple = lora.TARGETS
  lora_base_dtype: str | None = None
  # Vision-language models (``rljax.vision``): M-RoPE's split of the Dh/2 rotary frequencies
  # into (temporal, height, width) sections, and the image tower's hyperparameters as sorted
  # ``(key, value)`` pairs (its family reads them); None for text-only models.
  mrope_section: tuple | None = None
  mrope_interleaved: bool = False  # Qwen3-VL's assignment of frequencies (layers.mrope_components)
  vision: tuple | None = None
  # Whether the updates train the tower (``model.vision.trainable``; ``rljax.learner.state
  # .trainable``): False keeps ``visual`` as it was loaded, without gradients or optimizer state.
  vision_trainable: bool = True

  def __post_init__(self):
    # Old configs and command lines say remat=True/False (``--config.model.remat=True`` now
    # arrives as the string 'True').
    old = {True: "full", False: "none", "true": "full", "false": "none"}
    key = self.remat.lower() if isinstance(self.remat, str) else self.remat
    if isinstance(key, bool) or key in ("true", "false"):
      object.__setattr__(self, "remat", old[key])
    for name in DECLARED_FIELDS:  # a direct call gets the checks a config gets
      _check_declared(f"model.{name}", getattr(self, name))
    if self.sliding_window is not None and self.sliding_window < 1:
      raise ValueError(f"sliding_window={self.sliding_window}: must be >= 1 or None")
    if self.model_type not in supported_model_types():
      raise ValueError(f"unsupported architecture model_type={self.model_type!r}; "
                       f"supported: {', '.join(supported_model_types())}")
    if self.layer_types is not None:
      object.__setattr__(self, "layer_types", tuple(self.layer_types))
      if len(self.layer_types) != self.num_layers or not set(self.layer_types) <= set(LAYER_TYPES):
        raise ValueError(f"layer_types={self.layer_types}: expected {self.num_layers} entries of "
                         f"{LAYER_TYPES}")
    if self.hidden_act not in HIDDEN_ACTS:
      raise ValueError(f"unsupported hidden_act={self.hidden_act!r}; supported: {HIDDEN_ACTS}")
    object.__setattr__(self, "moe_layers", tuple(int(i) for i in self.moe_layers))
    if self.moe_layers and not (0 < self.experts_per_token <= self.num_experts):
      raise ValueError(f"experts_per_token={self.experts_per_token} must be in [1, num_experts="
                       f"{self.num_experts}]")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    rope_type = self.rope_dict.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
      raise ValueError(f"unsupported rope_type={rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
    self._check_lora()
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
    if self.mrope_section is not None:
      object.__setattr__(self, "mrope_section", tuple(int(n) for n in self.mrope_section))
      if sum(self.mrope_section) != self.head_dim // 2:
        raise ValueError(f"mrope_section={self.mrope_section} must sum to head_dim/2="
                         f"{self.head_dim // 2}")
    if isinstance(self.vision, Mapping):
      object.__setattr__(self, "vision", tuple(sorted(
          (k, tuple(v) if isinstance(v, list) else v) for k, v in self.vision.items())))

  def _check_lora(self) -> None:
    _check_declared("model.lora.rank", self.lora_rank)
    try:
      object.__setattr__(self, "lora_targets", lora.resolve_targets(self.lora_targets))
    except ValueError as e:
      raise ConfigError(str(e)) from None
    if self.lora_rank and (self.fused_qkv or self.fused_mlp):
      raise ValueError("adapters attach to the unfused q/k/v and gate/up kernels; the fused "
                       "(sampler) layout is built from merged weights (lora.merge_adapters)")
    if self.lora_rank:
      _check_declared("model.lora.alpha", self.lora_alpha)

  @property
  def base(self) -> "ModelConfig":
    """The same architecture without adapters (the reference model, the merged weights)."""
    return self if not self.lora_rank else self.replace(lora_rank=0, lora_base_dtype=None)

  @property
  def rope_dict(self) -> dict:
    return dict(self.rope_scaling or ())

  def layer_window(self, layer: int) -> int | None:
    """The sliding window of ``layer`` (None: full attention)."""
    if self.layer_types is None:
      return self.sliding_window
    return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

  def layer_rope(self, layer: int) -> tuple:
    """``(theta, scaling)`` of ``layer``'s RoPE: local layers may have a base of their own."""
    if (self.layer_types is not None and self.layer_types[layer] == "sliding_attention"
        and self.rope_local_theta is not None):
      return self.rope_local_theta, None
    return self.rope_theta, self.rope_scaling

  def is_moe_layer(self, layer: int) -> bool:
    return layer in self.moe_layers

  @property
  def uniform_layers(self) -> bool:
    """Whether every layer has the same structure and attention (``scan_layers`` needs it)."""
    first = (self.layer_window(0), self.layer_rope(0), self.is_moe_layer(0))
    return all((self.layer_window(i), self.layer_rope(i), self.is_moe_layer(i)) == first
               for i in range(self.num_layers))

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q = self.num_heads * self.head_dim
    kv = self.num_kv_heads * self.head_dim
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.qkv_bias else 0)
    dense = 3 * d * f
    moe = self.num_experts * (3 * d * self.moe_intermediate_size + d)
    mlps = sum(moe if self.is_moe_layer(i) else dense for i in range(self.num_layers))
    norms = self.num_layers * 2 * d  # families with more norms add a few d per layer at most
    return v * d * (1 if self.tie_embeddings else 2) + self.num_layers * attn + mlps + norms + d

  # --- Hugging Face ------------------------------------------------------------------------------
  @classmethod
  def from_hf_dict(cls, hf: Mapping[str, Any], **overrides) -> "ModelConfig":
    """The architecture of an HF config.json (its family reads the keys it needs)."""
    model_type = hf.get("model_type")
    if model_type not in supported_model_types():
      archs = hf.get("architectures")
      raise ModelFileError(f"unsupported architecture model_type={model_type!r} ({archs}); "
                           f"supported: {', '.join(supported_model_types())}")
    kwargs = families.get(model_type).config_from_hf(hf)
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_hf_dir(cls, path: str, **overrides) -> "ModelConfig":
    """The architecture of a local Hugging Face directory; anything wrong with it is one
    ``ModelFileError`` naming the directory or its config.json."""
    hf = read_hf_config(path)
    cfg_path = os.path.join(path, "config.json")
    try:
      return cls.from_hf_dict(hf, **overrides)
    except KeyError as e:
      raise ModelFileError(f"{cfg_path} has no {e.args[0]!r}, which the architecture needs") \
          from None
    except (ValueError, TypeError) as e:
      raise ModelFileError(f"{cfg_path}: {e}") from None

  def to_hf_dict(self) -> dict:
    """A config.json that ``transformers`` loads as the same architecture."""
    return families.get(self.model_type).config_to_hf(self)


def read_hf_config(path: str) -> dict:
  """The config.json of a local Hugging Face directory as a dict; a missing directory or file,
  or one that is not a JSON object, is one ``ModelFileError`` naming it."""
  if not os.path.isdir(path):
    raise ModelFileError(f"{path!r} is not a directory: expected a local Hugging Face model "
                         "directory (config.json + model.safetensors)")
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise ModelFileError(f"no config.json in {path!r}: not a Hugging Face model directory")
  try:
    with open(cfg_path, encoding="utf-8") as f:
      hf = json.load(f)
  except (OSError, ValueError) as e:
    raise ModelFileError(f"{cfg_path} is not readable JSON ({e}); re-download or re-export "
                         "the model") from None
  if not isinstance(hf, dict):
    raise ModelFileError(f"{cfg_path} holds a JSON {type(hf).__name__}, not an object")
  return hf


def supported_model_types() -> tuple[str, ...]:
  """The HF ``model_type``s with a family in ``rljax.models.families``."""
  return families.model_types()


def compute_dtype(value: str, platform: str | None = None) -> str:
  """``model.dtype``: 'auto' is bfloat16 on accelerators (master weights and optimizer state stay
  in ``model.param_dtype``, float32 by default) and float32 on CPU; any other value as given."""
  if value != "auto":
    return value
  if platform is None:
    platform = jax.default_backend()
  return "float32" if platform == "cpu" else "bfloat16"


def run_settings(model_section) -> dict:
  """The ``ModelConfig`` fields a run sets whatever the checkpoint: rematerialisation, the layer
  layout (scan), the attention backend, how MoE layers dispatch and replay routes, whether the
  vision tower trains, and the low-rank adapters."""
  m = model_section
  return dict(remat=m.remat, scan_layers=m.scan_layers, attention=m.attention,
              attention_block=m.attention_block, moe_dispatch=m.moe_dispatch,
              moe_capacity_factor=m.moe_capacity_factor, router_replay=m.router_replay,
              vision_trainable=bool(m.vision.trainable), **lora_settings(m))


def lora_settings(model_section, platform: str | None = None) -> dict:
  """The adapters a run puts on its policy (``model.lora.*``), as ``ModelConfig`` fields
  (``platform``: where the compute dtype is resolved, default the default backend)."""
  lo = model_section.lora
  base_dtype = (compute_dtype(model_section.dtype, platform) if lo.base_dtype == "compute"
                else None)
  return dict(lora_rank=lo.rank, lora_alpha=float(lo.alpha), lora_targets=lo.targets,
              lora_base_dtype=base_dtype if lo.rank else None)


# A 'tiny' MoE model: every layer sparse, top-k weights renormalised, transformers' default
# load-balancing weight (Qwen3-MoE's config).
_TINY_MOE = dict(norm_topk_prob=True, router_aux_loss_coef=0.001)


def tiny_config(model_cfg, vocab_size: int, **overrides) -> ModelConfig:
  """A fresh small model from the ``config.model`` section (``model.source='tiny'``) of the
  family ``model.family``."""
  family = model_cfg.family
  fields = dict(
      vocab_size=vocab_size,
      hidden_size=model_cfg.hidden_size,
      intermediate_size=model_cfg.intermediate_size,
      num_layers=model_cfg.num_layers,
      num_heads=model_cfg.num_heads,
      num_kv_heads=model_cfg.num_kv_heads,
      head_dim=model_cfg.hidden_size // model_cfg.num_heads,
      rope_theta=model_cfg.rope_theta,
      tie_embeddings=model_cfg.tie_embeddings,
      max_position_embeddings=4096,
      model_type=family,
      dtype=compute_dtype(model_cfg.dtype),
      param_dtype=model_cfg.param_dtype,
      **run_settings(model_cfg))
  fields.update(families.get(family).tiny_fields(model_cfg, fields))
  fields.update(overrides)
  return ModelConfig(**fields)


def matmul_precision(model_section):
  """The context a run traces its functions in: ``model.matmul_precision`` of the config.

  ``'default'`` leaves JAX's setting as it is (on GPUs float32 matmuls then use TF32, on TPUs
  bfloat16 passes); ``'high'`` and ``'highest'`` ask for more float32 precision, ``'highest'`` for
  parity with ``transformers`` in float32 on an accelerator. bfloat16 models are not affected.
  """
  value = model_section.matmul_precision
  if value not in MATMUL_PRECISIONS:
    raise ConfigError(f"model.matmul_precision={value!r} is not allowed: expected one of "
                      f"{list(MATMUL_PRECISIONS)}")
  if value == "default":
    return contextlib.nullcontext()
  return jax.default_matmul_precision(value)

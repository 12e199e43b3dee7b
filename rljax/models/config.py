"""Model configuration for the Llama family (Llama 1-3, Mistral, Qwen2), read from HF config.json."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Mapping

from rljax.errors import ModelFileError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
MATMUL_PRECISIONS = ("default", "high", "highest")
REMAT_CHOICES = ("none", "full", "dots")
ATTENTION_BACKENDS = ("auto", "xla", "blockwise", "cudnn", "pallas")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a decoder-only transformer as ``transformers`` defines the Llama family.

  ``rope_scaling`` is a sorted tuple of ``(key, value)`` pairs so the config stays hashable (it is
  a static argument of jitted functions).
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
  sliding_window: int | None = None  # Mistral: a query sees its last ``sliding_window`` slots

  def __post_init__(self):
    # Old configs and command lines say remat=True/False (``--config.model.remat=True`` now
    # arrives as the string 'True').
    old = {True: "full", False: "none", "true": "full", "false": "none"}
    key = self.remat.lower() if isinstance(self.remat, str) else self.remat
    if isinstance(key, bool) or key in ("true", "false"):
      object.__setattr__(self, "remat", old[key])
    if self.remat not in REMAT_CHOICES:
      raise ValueError(f"model.remat={self.remat!r}: expected one of {REMAT_CHOICES} "
                       "(or True/False for 'full'/'none')")
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"model.scan_layers={self.scan_layers!r}: expected True or False")
    if self.attention not in ATTENTION_BACKENDS:
      raise ValueError(f"model.attention={self.attention!r}: expected one of "
                       f"{ATTENTION_BACKENDS}")
    if self.attention_block < 1:
      raise ValueError(f"model.attention_block={self.attention_block}: must be >= 1")
    if self.sliding_window is not None and self.sliding_window < 1:
      raise ValueError(f"sliding_window={self.sliding_window}: must be >= 1 or None")
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"unsupported architecture model_type={self.model_type!r}; "
                       f"supported: {SUPPORTED_MODEL_TYPES}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    rope_type = self.rope_dict.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
      raise ValueError(f"unsupported rope_type={rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

  @property
  def rope_dict(self) -> dict:
    return dict(self.rope_scaling or ())

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q = self.num_heads * self.head_dim
    kv = self.num_kv_heads * self.head_dim
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.qkv_bias else 0)
    layer = attn + 3 * d * f + 2 * d
    return v * d * (1 if self.tie_embeddings else 2) + self.num_layers * layer + d

  # --- Hugging Face ------------------------------------------------------------------------------
  @classmethod
  def from_hf_dict(cls, hf: Mapping[str, Any], **overrides) -> "ModelConfig":
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      archs = hf.get("architectures")
      raise ModelFileError(f"unsupported architecture model_type={model_type!r} ({archs}); "
                           f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if hf.get("hidden_act", "silu") != "silu":
      raise ValueError(f"unsupported hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU)")
    if model_type == "qwen2" and hf.get("use_sliding_window"):
      raise ValueError("Qwen2 with use_sliding_window=True is not supported")
    # Mistral applies its window to every layer (``transformers`` MistralAttention); Llama has
    # none, and Qwen2's per-layer windows are refused above.
    window = hf.get("sliding_window") if model_type == "mistral" else None
    # transformers >= 5 writes rope_parameters; earlier versions rope_theta + rope_scaling.
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if "type" in rope and "rope_type" not in rope:
      rope["rope_type"] = rope.pop("type")
    rope_type = rope.get("rope_type", "default")
    scaling = None if rope_type == "default" else tuple(sorted(rope.items()))
    heads = hf["num_attention_heads"]
    kwargs = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=scaling,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        o_bias=model_type != "qwen2" and bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        model_type=model_type,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
        sliding_window=None if window is None else int(window),
    )
    if rope_type != "default" and "factor" not in rope:
      raise ValueError(f"rope scaling {rope_type!r} needs a 'factor'")
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_hf_dir(cls, path: str, **overrides) -> "ModelConfig":
    """The architecture of a local Hugging Face directory; anything wrong with it is one
    ``ModelFileError`` naming the directory or its config.json."""
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
    try:
      return cls.from_hf_dict(hf, **overrides)
    except KeyError as e:
      raise ModelFileError(f"{cfg_path} has no {e.args[0]!r}, which the architecture needs") \
          from None
    except (ValueError, TypeError) as e:
      raise ModelFileError(f"{cfg_path}: {e}") from None

  def to_hf_dict(self) -> dict:
    """A config.json that ``transformers`` loads as the same architecture."""
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM"}[self.model_type]
    rope = {"rope_theta": self.rope_theta, "rope_type": "default"}
    rope.update(self.rope_dict)
    hf = dict(
        architectures=[arch], model_type=self.model_type, vocab_size=self.vocab_size,
        hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
        num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
        num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
        rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, rope_parameters=rope,
        rope_scaling=None if self.rope_scaling is None else self.rope_dict,
        tie_word_embeddings=self.tie_embeddings, hidden_act="silu",
        max_position_embeddings=self.max_position_embeddings, torch_dtype=self.param_dtype,
        bos_token_id=self.bos_token_id,
        eos_token_id=list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
        else self.eos_token_id,
        pad_token_id=self.pad_token_id)
    if self.model_type == "qwen2":
      hf["use_sliding_window"] = False
    if self.model_type == "mistral":
      hf["sliding_window"] = self.sliding_window  # None: full attention (transformers' reading)
    else:
      hf["attention_bias"] = self.qkv_bias
      hf["mlp_bias"] = self.mlp_bias
    return hf


def tiny_config(model_cfg, vocab_size: int, **overrides) -> ModelConfig:
  """A fresh small model from the ``config.model`` section (``model.source='tiny'``)."""
  return ModelConfig(
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
      dtype=model_cfg.dtype,
      param_dtype=model_cfg.param_dtype,
      remat=model_cfg.remat,
      scan_layers=model_cfg.scan_layers,
      attention=model_cfg.attention,
      attention_block=model_cfg.attention_block,
      **overrides)


def matmul_precision(model_section):
  """The context a run traces its functions in: ``model.matmul_precision`` of the config.

  ``'default'`` leaves JAX's setting as it is (on GPUs float32 matmuls then use TF32, on TPUs
  bfloat16 passes); ``'high'`` and ``'highest'`` ask for more float32 precision, ``'highest'`` for
  parity with ``transformers`` in float32 on an accelerator. bfloat16 models are not affected.
  """
  value = model_section.matmul_precision
  if value not in MATMUL_PRECISIONS:
    raise ValueError(f"model.matmul_precision={value!r}: expected one of {MATMUL_PRECISIONS}")
  if value == "default":
    return contextlib.nullcontext()
  import jax
  return jax.default_matmul_precision(value)

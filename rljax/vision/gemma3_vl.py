"""Gemma 3 with images (Gemma Team 2025, "Gemma 3 Technical Report"): the SigLIP tower, the
multi-modal projector, and the family (``model_type='gemma3'``,
``Gemma3ForConditionalGeneration``).

Each image is a fixed-size square ``[C, H, H]`` (the processor resizes; no pan-and-scan here),
cut into ``(H / P)^2`` patches and encoded by SigLIP (Zhai et al. 2023, "Sigmoid Loss for
Language Image Pre-Training"), then pooled to ``mm_tokens_per_image`` soft tokens:

  x = conv_P(pixels) + pos_embed                  patch embedding (stride = kernel: a linear map
                                                  of each flattened patch) and learned positions
  x += attn(ln1(x)); x += fc2(gelu(fc1(ln2(x))))  per layer: LayerNorm, bidirectional attention
                                                  over the image's patches
  x = post_ln(x)
  y = rmsnorm(avgpool_k(x)) W                     the projector: k x k average pooling of the
                                                  patch grid to sqrt(mm_tokens) per side,
                                                  Gemma's (1 + w) RMSNorm, [D_vision, D_text]

The language model is Gemma 3's text model (``rljax.models.families.gemma3``) with one change,
which ``rljax.vision.multimodal`` makes: the soft tokens of one image attend to each other in
both directions (``transformers``' ``token_type_ids`` mask: causal OR same image, then the
sliding window on the local layers). Positions are plain 1-D ones; ``RowImages.positions``
carries them as one component ``[R, 1, S]``. The tensors keep the names ``transformers``
writes (``language_model.model.*``, ``vision_tower.*``, ``multi_modal_projector.*``: ``rename``,
``export_name``).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import layers
from rljax.models.config import ModelConfig
from rljax.models.families import Family, register_family
from rljax.models.families import gemma3 as gemma3_text

MODEL_TYPE = "gemma3"
ARCHITECTURE = "Gemma3ForConditionalGeneration"
# The tower's hyperparameters (``ModelConfig.vision``) and their SigLIP defaults in Gemma 3.
VISION_DEFAULTS = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                       num_attention_heads=16, num_channels=3, image_size=896, patch_size=14,
                       layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")
TOKEN_IDS = dict(image_token_id=262144, boi_token_id=255999, eoi_token_id=256000)
# The soft tokens of one image attend to each other both ways (``multimodal.block_attend``).
BLOCK_ATTENTION = True
# transformers' names of the token ids in config.json.
_HF_TOKEN_KEYS = dict(image_token_id="image_token_index", boi_token_id="boi_token_index",
                      eoi_token_id="eoi_token_index")


def vision_config(cfg: ModelConfig) -> dict:
  """The tower's hyperparameters, ``mm_tokens_per_image`` and the image token ids of ``cfg``."""
  if cfg.vision is None:
    raise ValueError(f"model_type={cfg.model_type!r} has no vision tower (text-only config)")
  return dict(cfg.vision)


def grid_sizes(vision: dict) -> tuple[int, int, int]:
  """(patches per side, soft tokens per side, pooling kernel) of one image."""
  side = vision["image_size"] // vision["patch_size"]
  tokens = math.isqrt(vision["mm_tokens_per_image"])
  if tokens * tokens != vision["mm_tokens_per_image"] or side % tokens:
    raise ValueError(f"mm_tokens_per_image={vision['mm_tokens_per_image']} must be a square "
                     f"whose side divides the {side} patches per side")
  return side, tokens, side // tokens


# --- the tower (Flax NNX) -------------------------------------------------------------------------

def _tower_cfg(cfg: ModelConfig, vision: dict) -> ModelConfig:
  """The settings the tower's ``layers.Linear`` / ``RMSNorm`` read: no adapters, the
  projector's norm epsilon, the model's dtypes."""
  return cfg.replace(rms_norm_eps=vision["layer_norm_eps"], lora_rank=0, lora_base_dtype=None)


class EncoderLayer(nnx.Module):
  """``x += out(attn(q, k, v of ln1(x))); x += fc2(gelu_tanh(fc1(ln2(x))))`` over one image."""

  def __init__(self, tcfg: ModelConfig, vision: dict, *, rngs: nnx.Rngs):
    d, eps = vision["hidden_size"], vision["layer_norm_eps"]
    lin = lambda i, o, axes: layers.Linear(i, o, axes=axes, bias=True, cfg=tcfg, rngs=rngs)
    self.layer_norm1 = layers.LayerNorm(d, eps, tcfg)
    self.layer_norm2 = layers.LayerNorm(d, eps, tcfg)
    self.q_proj, self.k_proj, self.v_proj = (lin(d, d, ("embed", "q_heads")) for _ in range(3))
    self.out_proj = lin(d, d, ("q_heads", "embed"))
    self.fc1 = lin(d, vision["intermediate_size"], ("embed", "mlp"))
    self.fc2 = lin(vision["intermediate_size"], d, ("mlp", "embed"))
    self.num_heads = vision["num_attention_heads"]

  def __call__(self, x):
    """x [M, N, D]: M images of N patches."""
    m, n, d = x.shape
    h = self.layer_norm1(x)
    q, k, v = (p(h).reshape(m, n, self.num_heads, -1) for p in (self.q_proj, self.k_proj,
                                                                self.v_proj))
    scores = jnp.einsum("mqhd,mkhd->mhqk", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores / np.float32(math.sqrt(q.shape[-1])), axis=-1)
    attn = jnp.einsum("mhqk,mkhd->mqhd", probs.astype(v.dtype), v).reshape(m, n, d)
    x = x + self.out_proj(attn)
    return x + self.fc2(jax.nn.gelu(self.fc1(self.layer_norm2(x)), approximate=True))


class VisionTower(nnx.Module):
  """SigLIP and Gemma 3's projector (module doc): ``tower(pixels [M, C, H, H], layout=None)`` ->
  ``[M * mm_tokens_per_image, D_text]``, image by image (as their placeholders come)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    v = vision_config(cfg)
    d, p, c = v["hidden_size"], v["patch_size"], v["num_channels"]
    tcfg = _tower_cfg(cfg, v)
    pdt = jnp.dtype(cfg.param_dtype)
    side, self.tokens_side, self.kernel = grid_sizes(v)
    # The Conv2d's weight as transformers stores it [D, C, P, P] (stride = kernel).
    self.patch_embedding = nnx.Param(0.02 * jax.random.normal(rngs.params(), (d, c, p, p), pdt),
                                     logical_axes=("embed", None, None, None))
    self.patch_bias = nnx.Param(jnp.zeros((d,), pdt), logical_axes=("embed",))
    self.position_embedding = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (side * side, d), pdt),
        logical_axes=(None, "embed"))
    self.depth = v["num_hidden_layers"]
    for i in range(self.depth):
      setattr(self, f"layers_{i}", EncoderLayer(tcfg, v, rngs=rngs))
    self.post_layernorm = layers.LayerNorm(d, v["layer_norm_eps"], tcfg)
    self.mm_soft_emb_norm = layers.RMSNorm(d, cfg=tcfg, offset=True)
    self.mm_input_projection = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (d, cfg.hidden_size), pdt),
        logical_axes=("embed", None))
    self.side, self.patch = side, p
    self.dtype = jnp.dtype(cfg.dtype)

  def __call__(self, pixels, lay=None):
    """pixels [M, C, H, H] (the processor's ``pixel_values``); ``lay`` unused (every image has
    the same layout)."""
    m, c, hh, ww = pixels.shape
    s, p = self.side, self.patch
    if (hh, ww) != (s * p, s * p):
      raise ValueError(f"images of {hh}x{ww} pixels; this tower takes {s * p}x{s * p}")
    patches = pixels.astype(self.dtype).reshape(m, c, s, p, s, p).transpose(0, 2, 4, 1, 3, 5)
    kernel = self.patch_embedding[...].astype(self.dtype).reshape(-1, c * p * p)
    x = jnp.dot(patches.reshape(m, s * s, -1), kernel.T) + self.patch_bias[...].astype(self.dtype)
    x = x + self.position_embedding[...].astype(self.dtype)
    for i in range(self.depth):
      x = getattr(self, f"layers_{i}")(x)
    x = self.post_layernorm(x)
    t, k = self.tokens_side, self.kernel  # the patch grid row-major, pooled k x k
    pooled = x.reshape(m, t, k, t, k, -1).mean(axis=(2, 4), dtype=jnp.float32).astype(x.dtype)
    y = jnp.dot(self.mm_soft_emb_norm(pooled.reshape(m * t * t, -1)),
                self.mm_input_projection[...].astype(self.dtype))
    return y


# --- the family: config.json and tensor names -----------------------------------------------------

def config_from_hf(hf) -> dict:
  """The text model from ``text_config`` (Gemma 3's text family reads it), the tower from
  ``vision_config``, the token ids and ``mm_tokens_per_image`` from the top level."""
  text = dict(hf.get("text_config") or {})
  text.setdefault("model_type", "gemma3_text")
  seen = hf.get("vision_config") or {}
  vision = {k: seen.get(k, d) for k, d in VISION_DEFAULTS.items()}
  if vision["hidden_act"] != "gelu_pytorch_tanh":
    raise ValueError(f"vision_config.hidden_act={vision['hidden_act']!r}: only "
                     "'gelu_pytorch_tanh' (SigLIP)")
  vision.update({k: int(hf.get(_HF_TOKEN_KEYS[k], hf.get(k, d))) for k, d in TOKEN_IDS.items()})
  vision["mm_tokens_per_image"] = int(hf.get("mm_tokens_per_image", 256))
  out = gemma3_text.config_from_hf(text)
  grid_sizes(vision)
  return dict(out, model_type=MODEL_TYPE,
              tie_embeddings=bool(hf.get("tie_word_embeddings", out["tie_embeddings"])),
              vision=vision)


def config_to_hf(cfg: ModelConfig) -> dict:
  """config.json as ``transformers`` 5 writes a ``Gemma3Config``."""
  v = vision_config(cfg)
  text = gemma3_text.config_to_hf(cfg)
  del text["architectures"]
  text["model_type"] = "gemma3_text"
  vision = {k: v[k] for k in VISION_DEFAULTS}
  # No pooling head: Gemma 3 never runs it (a checkpoint's is skipped on load, ``ignored``).
  vision.update(model_type="siglip_vision_model", vision_use_head=False)
  return dict(architectures=[ARCHITECTURE], model_type=MODEL_TYPE, text_config=text,
              vision_config=vision, mm_tokens_per_image=v["mm_tokens_per_image"],
              tie_word_embeddings=cfg.tie_embeddings,
              **{_HF_TOKEN_KEYS[k]: v[k] for k in TOKEN_IDS})


_TOWER = "vision_tower."
_HEAD = "vision_tower.head."  # SigLIP's attention-pooling head: Gemma 3 reads the patches


def tower_tensors(cfg: ModelConfig) -> dict:
  """``vision_tower.*`` and ``multi_modal_projector.*`` -> (path under ``visual``, transpose,
  None)."""
  at = lambda *p: ("visual",) + p
  out = {f"{_TOWER}embeddings.patch_embedding.weight": (at("patch_embedding"), False, None),
         f"{_TOWER}embeddings.patch_embedding.bias": (at("patch_bias"), False, None),
         f"{_TOWER}embeddings.position_embedding.weight": (at("position_embedding"), False, None),
         f"{_TOWER}post_layernorm.weight": (at("post_layernorm", "scale"), False, None),
         f"{_TOWER}post_layernorm.bias": (at("post_layernorm", "bias"), False, None),
         "multi_modal_projector.mm_input_projection_weight": (at("mm_input_projection"), False,
                                                              None),
         "multi_modal_projector.mm_soft_emb_norm.weight": (at("mm_soft_emb_norm", "scale"), False,
                                                           None)}
  for i in range(vision_config(cfg)["num_hidden_layers"]):
    hf_layer, ours = f"{_TOWER}encoder.layers.{i}.", at(f"layers_{i}")
    for n in ("layer_norm1", "layer_norm2"):
      out[f"{hf_layer}{n}.weight"] = (ours + (n, "scale"), False, None)
      out[f"{hf_layer}{n}.bias"] = (ours + (n, "bias"), False, None)
    for hf_name, name in (("self_attn.q_proj", "q_proj"), ("self_attn.k_proj", "k_proj"),
                          ("self_attn.v_proj", "v_proj"), ("self_attn.out_proj", "out_proj"),
                          ("mlp.fc1", "fc1"), ("mlp.fc2", "fc2")):
      out[f"{hf_layer}{hf_name}.weight"] = (ours + (name, "kernel"), True, None)
      out[f"{hf_layer}{hf_name}.bias"] = (ours + (name, "bias"), False, None)
  return out


def rename(name: str) -> str:
  """A checkpoint's name -> the decoder's (``model.layers.*``) or the tower's
  (``vision_tower.*``): transformers 5 and the original checkpoints write
  ``language_model.model.*`` and ``vision_tower.vision_model.*`` (5 drops ``vision_model``),
  4.50-4.57 ``model.language_model.*``, ``model.vision_tower.*``, ``model.multi_modal_projector.*``.
  SigLIP's pooling head (``vision_tower.head.*``), which Gemma 3 never runs, maps to nothing
  (``hf_name_to_path`` skips it)."""
  for old, new in (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                   ("model.language_model.", "model."), ("model.vision_tower.", _TOWER),
                   ("model.multi_modal_projector.", "multi_modal_projector.")):
    if name.startswith(old):
      name = new + name[len(old):]
      break
  if name.startswith(_TOWER + "vision_model."):
    name = _TOWER + name[len(_TOWER + "vision_model."):]
  return name


def export_name(name: str) -> str:
  """The decoder's names as transformers 5 writes them (``language_model.model.*``)."""
  for ours, hf in (("model.", "language_model.model."), ("lm_head.", "language_model.lm_head.")):
    if name.startswith(ours):
      return hf + name[len(ours):]
  return name


def ignored(name: str) -> bool:
  """Tensors of a checkpoint that Gemma 3 never reads (SigLIP's pooling head)."""
  return rename(name).startswith(_HEAD)


# A fresh tiny model's tower (``model.source='tiny'``): two SigLIP layers over 28x28 images of
# the processor's 14-pixel patches (2x2), one soft token each (pooled 2x2).
TINY_VISION = dict(VISION_DEFAULTS, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, image_size=28, mm_tokens_per_image=1)


def tiny_fields(model_section, fields) -> dict:
  """Gemma 3's text settings (local layers of a 16-token window, the last one global), a tiny
  tower, and the image tokens as the last three ids of the vocabulary in the order
  ``data.tokenizer='char_vl'`` appends its placeholders (start, image, end)."""
  v = fields["vocab_size"]
  vision = dict(TINY_VISION, boi_token_id=v - 3, image_token_id=v - 2, eoi_token_id=v - 1)
  return dict(hidden_act="gelu_pytorch_tanh", query_pre_attn_scalar=fields["head_dim"],
              layer_types=("sliding_attention",) * (fields["num_layers"] - 1) + (
                  "full_attention",), sliding_window=16, vision=vision)


register_family(Family(
    name=MODEL_TYPE, model_types=(MODEL_TYPE,), block=gemma3_text.SandwichBlock,
    final_norm=lambda dim, cfg: layers.RMSNorm(dim, cfg=cfg, offset=True),
    config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    layer_tensors=gemma3_text.FAMILY.layer_tensors, embed_scale=True, tower=VisionTower,
    extra_tensors=tower_tensors, rename=rename, export_name=export_name, ignored=ignored,
    tiny_fields=tiny_fields))

"""Qwen3-VL (Qwen Team 2025, "Qwen3-VL Technical Report"): the vision tower and its family.

What differs from Qwen2.5-VL (``qwen2_5_vl``, whose positions, grid layout and rotary helpers
this reuses):

  x = patch_embed(pixels) + b                      a Conv3d with bias, 16-pixel patches
  x += interp(pos_embed)                           the learned square grid of positions resampled
                                                   bilinearly (align_corners) to each image's grid
  x += attn(ln1(x)); x += fc2(gelu(fc1(ln2(x))))   per block: LayerNorm, 2-D rotary positions,
                                                   bidirectional attention within the image (no
                                                   windows), a plain GELU MLP
  deep_k = merger_k(x after block i_k)             DeepStack (Meng et al. 2024): features of the
                                                   blocks ``deepstack_visual_indexes``, each by its
                                                   own merger (LayerNorm over the 2x2 block)
  y = fc2(gelu(fc1(ln(x).reshape(N / 4, 4 D))))    the patch merger

and in the language model (Qwen3's block, q/k RMSNorm): M-RoPE frequencies interleaved over
(t, h, w) (``layers.mrope_components``), and ``deep_k`` added to the output of layer ``k`` at
the image positions (``Transformer(deepstack=)``, ``multimodal.row_embeddings``). The tensors keep
``transformers``' names (``model.visual.*``, ``model.language_model.*``).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import layers
from rljax.models.config import ModelConfig
from rljax.models.families import (Family, common_from_hf, common_to_hf, register_family)
from rljax.models.families import qwen3 as qwen3_text
from rljax.models.families.llama import PreNormBlock
from rljax.vision import qwen2_5_vl

MODEL_TYPE = "qwen3_vl"
ARCHITECTURE = "Qwen3VLForConditionalGeneration"
VISION_DEFAULTS = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                       in_channels=3, patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                       out_hidden_size=3584, num_position_embeddings=2304,
                       deepstack_visual_indexes=(8, 16, 24), hidden_act="gelu_pytorch_tanh",
                       rope_theta=10000.0)
TOKEN_IDS = qwen2_5_vl.TOKEN_IDS
_EPS = 1e-6  # the tower's LayerNorms (transformers hard-codes it)
vision_config = qwen2_5_vl.vision_config


# --- the layout of a batch of images (host, numpy) ----------------------------------------------

class Layout(NamedTuple):
  """``qwen2_5_vl.Layout``'s fields (no windows: ``order`` and ``unorder`` are the identity,
  ``windows`` = ``images``) and the position table's bilinear taps: ``pos_index`` [N, 4] rows
  of the learned grid, ``pos_weight`` [N, 4] their weights."""
  order: np.ndarray
  windows: np.ndarray
  images: np.ndarray
  positions: np.ndarray
  unorder: np.ndarray
  pos_index: np.ndarray
  pos_weight: np.ndarray


def _axis_taps(index, size, side: int):
  """Bilinear taps (floor, floor + 1; clamped to the grid) and weights of target ``index`` on an
  axis of ``size`` resampled from ``side`` (align_corners: the ends map to 0 and side - 1)."""
  src = index.astype(np.float32) * np.float32(side - 1) / np.maximum(size - 1, 1).astype(
      np.float32)
  floor = np.floor(src)
  offsets = np.arange(2)
  taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
  weights = np.maximum(1 - np.abs(src[:, None] - floor[:, None] - offsets), 0)
  return taps, weights.astype(np.float32)


def layout(grid_thw, vision: dict) -> Layout:
  """The ``Layout`` of images with grid sizes ``grid_thw`` [n_images, 3] (host arrays)."""
  grid = np.asarray(grid_thw, np.int64).reshape(-1, 3)
  merge = vision["spatial_merge_size"]
  if (grid[:, 1:] % merge).any():
    raise ValueError(f"image_grid_thw {grid.tolist()}: heights and widths must be multiples of "
                     f"spatial_merge_size={merge}")
  n = int(np.prod(grid, axis=1).sum())
  frames = np.repeat(np.arange(int(grid[:, 0].sum())), np.repeat(grid[:, 1] * grid[:, 2],
                                                                 grid[:, 0]))
  positions = qwen2_5_vl.patch_positions(grid, merge)
  counts = np.prod(grid, axis=1)
  heights, widths = np.repeat(grid[:, 1], counts), np.repeat(grid[:, 2], counts)
  side = int(round(vision["num_position_embeddings"] ** 0.5))
  h_taps, h_w = _axis_taps(positions[:, 0], heights, side)
  w_taps, w_w = _axis_taps(positions[:, 1], widths, side)
  index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(n, 4)
  weight = (h_w[:, :, None] * w_w[:, None, :]).reshape(n, 4)
  ids = np.arange(n, dtype=np.int32)
  return Layout(order=ids, windows=frames.astype(np.int32), images=frames.astype(np.int32),
                positions=positions, unorder=np.arange(n // merge ** 2, dtype=np.int32),
                pos_index=index.astype(np.int32), pos_weight=weight)


# --- the tower (Flax NNX) -------------------------------------------------------------------------

def _tower_cfg(cfg: ModelConfig) -> ModelConfig:
  return cfg.replace(lora_rank=0, lora_base_dtype=None)


class VisionBlock(nnx.Module):
  """``x += proj(attn(rope(qkv(ln1(x))))); x += fc2(act(fc1(ln2(x))))`` within each image."""

  def __init__(self, tcfg: ModelConfig, v: dict, *, rngs: nnx.Rngs):
    d = v["hidden_size"]
    lin = lambda i, o, axes: layers.Linear(i, o, axes=axes, bias=True, cfg=tcfg, rngs=rngs)
    self.norm1 = layers.LayerNorm(d, _EPS, tcfg)
    self.norm2 = layers.LayerNorm(d, _EPS, tcfg)
    self.qkv = lin(d, 3 * d, ("embed", "q_heads"))
    self.proj = lin(d, d, ("q_heads", "embed"))
    self.linear_fc1 = lin(d, v["intermediate_size"], ("embed", "mlp"))
    self.linear_fc2 = lin(v["intermediate_size"], d, ("mlp", "embed"))
    self.num_heads = v["num_heads"]
    self.act = layers.ACTIVATIONS[v["hidden_act"]]

  def __call__(self, x, rope: layers.Rope, segments):
    x = x + qwen2_5_vl.block_attention(self, x, rope, segments)
    return x + self.linear_fc2(self.act(self.linear_fc1(self.norm2(x))))


class PatchMerger(nnx.Module):
  """``fc2(gelu(fc1(ln(x).reshape(N / 4, 4 D))))``; ``postshuffle``: the norm over the 2x2
  block's ``4 D`` (the DeepStack mergers)."""

  def __init__(self, tcfg: ModelConfig, d: int, unit: int, out: int, postshuffle: bool, *,
               rngs: nnx.Rngs):
    self.norm = layers.LayerNorm(unit * d if postshuffle else d, _EPS, tcfg)
    self.linear_fc1 = layers.Linear(unit * d, unit * d, axes=("embed", "mlp"), bias=True,
                                    cfg=tcfg, rngs=rngs)
    self.linear_fc2 = layers.Linear(unit * d, out, axes=("mlp", "embed"), bias=True, cfg=tcfg,
                                    rngs=rngs)
    self.unit, self.postshuffle = unit, postshuffle

  def __call__(self, x):
    blocks = lambda a: a.reshape(a.shape[0] // self.unit, -1)
    h = self.norm(blocks(x)) if self.postshuffle else blocks(self.norm(x))
    return self.linear_fc2(jax.nn.gelu(self.linear_fc1(h), approximate=False))


class VisionTower(nnx.Module):
  """Qwen3-VL's image encoder (module doc): ``tower(pixels [N, P], layout)`` -> (``[N / 4,
  D_text]``, DeepStack features ``[K, N / 4, D_text]``), image by image."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    v = vision_config(cfg)
    d, unit = v["hidden_size"], v["spatial_merge_size"] ** 2
    tcfg = _tower_cfg(cfg)
    pdt = jnp.dtype(cfg.param_dtype)
    self.patch_embed = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (d, v["in_channels"], v["temporal_patch_size"],
                                                 v["patch_size"], v["patch_size"]), pdt),
        logical_axes=("embed", None, None, None, None))
    self.patch_bias = nnx.Param(jnp.zeros((d,), pdt), logical_axes=("embed",))
    self.pos_embed = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (v["num_position_embeddings"], d), pdt),
        logical_axes=(None, "embed"))
    self.depth = v["depth"]
    for i in range(self.depth):
      setattr(self, f"blocks_{i}", VisionBlock(tcfg, v, rngs=rngs))
    self.merger = PatchMerger(tcfg, d, unit, cfg.hidden_size, False, rngs=rngs)
    self.deep = tuple(int(i) for i in v["deepstack_visual_indexes"])
    for k in range(len(self.deep)):
      setattr(self, f"deepstack_{k}", PatchMerger(tcfg, d, unit, cfg.hidden_size, True,
                                                  rngs=rngs))
    self.head_dim = d // v["num_heads"]
    self.theta = float(v["rope_theta"])
    self.dtype = jnp.dtype(cfg.dtype)

  def __call__(self, pixels, lay: Layout):
    x = (qwen2_5_vl.embed_patches(self.patch_embed[...], pixels, self.dtype)
         + self.patch_bias[...].astype(self.dtype))
    table = self.pos_embed[...].astype(jnp.float32)
    pos = jnp.sum(jnp.take(table, jnp.asarray(lay.pos_index), axis=0)
                  * jnp.asarray(lay.pos_weight, jnp.float32)[..., None], axis=1)
    x = x + pos.astype(self.dtype)
    rope = qwen2_5_vl.vision_rope(jnp.asarray(lay.positions), self.head_dim, self.theta)
    segments = jnp.asarray(lay.images)
    deep = []
    for i in range(self.depth):
      x = getattr(self, f"blocks_{i}")(x, rope, segments)
      if i in self.deep:
        deep.append(getattr(self, f"deepstack_{self.deep.index(i)}")(x))
    return self.merger(x), jnp.stack(deep)


# --- the family: config.json and tensor names -----------------------------------------------------

def config_from_hf(hf) -> dict:
  """config.json of ``transformers`` >= 4.57: ``text_config`` (Qwen3 with interleaved M-RoPE in
  ``rope_parameters`` / ``rope_scaling``), ``vision_config``, the token ids at the top."""
  text = dict(hf.get("text_config") or {})
  if text.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act={text['hidden_act']!r}; only 'silu' (SwiGLU)")
  rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
  section = rope.pop("mrope_section", None)
  interleaved = bool(rope.pop("mrope_interleaved", True))
  if section is None:
    raise ValueError("no mrope_section in rope_parameters / rope_scaling: M-RoPE needs it")
  if rope.pop("type", rope.get("rope_type")) in ("mrope", "default", None):
    rope["rope_type"] = "default"
  text.pop("rope_scaling", None)
  seen = hf.get("vision_config") or {}
  vision = {k: seen.get(k, d) for k, d in VISION_DEFAULTS.items()}
  vision["rope_theta"] = (seen.get("rope_parameters") or {}).get("rope_theta",
                                                                  vision["rope_theta"])
  vision["deepstack_visual_indexes"] = tuple(vision["deepstack_visual_indexes"])
  vision.update({k: int(hf.get(k, text.get(k, d))) for k, d in TOKEN_IDS.items()})
  if vision["out_hidden_size"] != text["hidden_size"]:
    raise ValueError(f"vision_config.out_hidden_size={vision['out_hidden_size']} differs from the "
                     f"text model's hidden_size={text['hidden_size']}")
  if len(vision["deepstack_visual_indexes"]) > text["num_hidden_layers"]:
    raise ValueError(f"{len(vision['deepstack_visual_indexes'])} DeepStack levels for "
                     f"{text['num_hidden_layers']} text layers")
  text["model_type"] = MODEL_TYPE
  text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
  return dict(common_from_hf(dict(text, rope_parameters=rope)),
              qkv_bias=bool(text.get("attention_bias", False)),
              o_bias=bool(text.get("attention_bias", False)), mrope_section=tuple(section),
              mrope_interleaved=interleaved, vision=vision)


def config_to_hf(cfg: ModelConfig) -> dict:
  """config.json as ``transformers`` 5 writes a ``Qwen3VLConfig``."""
  v = vision_config(cfg)
  text = common_to_hf(cfg, ARCHITECTURE)
  del text["architectures"], text["rope_scaling"]
  text.update(model_type="qwen3_vl_text", hidden_act="silu", attention_bias=cfg.qkv_bias,
              rope_parameters=dict(text["rope_parameters"], mrope_section=list(cfg.mrope_section),
                                   mrope_interleaved=cfg.mrope_interleaved))
  vision = {k: v[k] for k in VISION_DEFAULTS if k != "rope_theta"}
  vision.update(model_type="qwen3_vl_vision",
                deepstack_visual_indexes=list(vision["deepstack_visual_indexes"]),
                rope_parameters={"rope_type": "axial", "rope_theta": v["rope_theta"]})
  return dict(architectures=[ARCHITECTURE], model_type=MODEL_TYPE, text_config=text,
              vision_config=vision, tie_word_embeddings=cfg.tie_embeddings,
              **{k: v[k] for k in TOKEN_IDS})


def tower_tensors(cfg: ModelConfig) -> dict:
  """``model.visual.*`` -> (path under ``visual``, transpose, None)."""
  at = lambda *p: ("visual",) + p
  pre = "model.visual."
  out = {f"{pre}patch_embed.proj.weight": (at("patch_embed"), False, None),
         f"{pre}patch_embed.proj.bias": (at("patch_bias"), False, None),
         f"{pre}pos_embed.weight": (at("pos_embed"), False, None)}

  def merger(hf_name, ours):
    for p in ("norm",):
      out[f"{pre}{hf_name}.{p}.weight"] = (at(ours, p, "scale"), False, None)
      out[f"{pre}{hf_name}.{p}.bias"] = (at(ours, p, "bias"), False, None)
    for p in ("linear_fc1", "linear_fc2"):
      out[f"{pre}{hf_name}.{p}.weight"] = (at(ours, p, "kernel"), True, None)
      out[f"{pre}{hf_name}.{p}.bias"] = (at(ours, p, "bias"), False, None)

  merger("merger", "merger")
  v = vision_config(cfg)
  for k in range(len(v["deepstack_visual_indexes"])):
    merger(f"deepstack_merger_list.{k}", f"deepstack_{k}")
  for i in range(v["depth"]):
    block, ours = f"{pre}blocks.{i}.", at(f"blocks_{i}")
    for n in ("norm1", "norm2"):
      out[f"{block}{n}.weight"] = (ours + (n, "scale"), False, None)
      out[f"{block}{n}.bias"] = (ours + (n, "bias"), False, None)
    for hf_name, name in (("attn.qkv", "qkv"), ("attn.proj", "proj"),
                          ("mlp.linear_fc1", "linear_fc1"), ("mlp.linear_fc2", "linear_fc2")):
      out[f"{block}{hf_name}.weight"] = (ours + (name, "kernel"), True, None)
      out[f"{block}{hf_name}.bias"] = (ours + (name, "bias"), False, None)
  return out


_LM = "model.language_model."


def rename(name: str) -> str:
  """The decoder's ``model.language_model.*`` -> ``model.*`` (the shared names)."""
  return "model." + name[len(_LM):] if name.startswith(_LM) else name


def export_name(name: str) -> str:
  """The decoder's names as ``transformers`` writes them (``model.language_model.*``)."""
  if name.startswith("model.") and not name.startswith("model.visual."):
    return _LM + name[len("model."):]
  return name


# A fresh tiny model's tower (``model.source='tiny'``): two blocks (the first feeding DeepStack)
# over the processor's 16-pixel patches merged 2x2, a 4x4 grid of learned positions.
TINY_VISION = dict(VISION_DEFAULTS, depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                   num_position_embeddings=16, deepstack_visual_indexes=(0,))


def tiny_fields(model_section, fields) -> dict:
  """A tiny tower, q/k norms, interleaved M-RoPE sections for the head size, and the
  placeholders as the last three ids of the vocabulary in ``data.tokenizer='char_vl'``'s order
  (vision start, image pad, vision end); no video token (one past the vocabulary)."""
  v = fields["vocab_size"]
  vision = dict(TINY_VISION, out_hidden_size=fields["hidden_size"], vision_start_token_id=v - 3,
                image_token_id=v - 2, vision_end_token_id=v - 1, video_token_id=v)
  return dict(mrope_section=qwen2_5_vl.mrope_sections(fields["head_dim"]),
              mrope_interleaved=True, vision=vision)


register_family(Family(
    name=MODEL_TYPE, model_types=(MODEL_TYPE,), block=functools.partial(PreNormBlock,
                                                                        qk_norm=True),
    final_norm=lambda dim, cfg: layers.RMSNorm(dim, cfg=cfg), config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, layer_tensors=qwen3_text.layer_tensors, tower=VisionTower,
    extra_tensors=tower_tensors, rename=rename, export_name=export_name, tiny_fields=tiny_fields))

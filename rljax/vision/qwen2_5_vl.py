"""Qwen2.5-VL (Bai et al. 2025, "Qwen2.5-VL Technical Report"): the vision tower and its family.

The tower maps pixel patches ``[N, C * temporal_patch_size * patch_size^2]`` (the Hugging Face
processor's ``pixel_values``) and grid sizes ``image_grid_thw`` [n_images, 3] (patches along
time, height, width) to one embedding per 2x2 block of patches, ``[N / 4, D_text]``:

  x = patch_embed(pixels)                          a linear over the flattened patch (= the Conv3d)
  x = x[order]                                     the window order (``layout``)
  x += attn(norm1(x)); x += mlp(norm2(x))          per block: 2-D rotary positions (h, w),
                                                   bidirectional attention within a window, or
                                                   within the image on the full-attention
                                                   blocks (``fullatt_block_indexes``)
  y = mlp(norm(x).reshape(N / 4, 4 D))[unorder]    the patch merger, back to the image order

Everything that depends on the grid sizes only (the permutations, which slots share a window or
an image, the rotary positions) is computed once on the host (``layout``); the jitted tower
takes those arrays. The language model is Qwen2's block (q/k/v biases) with M-RoPE
(``layers.rope_at``); the tensors keep ``transformers``' names (``visual.*`` beside the causal
LM's, or ``model.visual.*`` and ``model.language_model.*``: ``rename``).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.errors import ConfigError
from rljax.models import layers
from rljax.models.config import ModelConfig
from rljax.models.families import (Family, common_from_hf, common_to_hf, dense_tensors,
                                   register_family)
from rljax.models.families.llama import PreNormBlock

MODEL_TYPE = "qwen2_5_vl"
ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
# The tower's hyperparameters (``ModelConfig.vision``) and their ``transformers`` defaults.
VISION_DEFAULTS = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                       in_channels=3, patch_size=14, temporal_patch_size=2, spatial_merge_size=2,
                       window_size=112, out_hidden_size=3584, fullatt_block_indexes=(7, 15, 23, 31),
                       hidden_act="silu", rope_theta=10000.0, tokens_per_second=4)
TOKEN_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                 vision_end_token_id=151653)
_EPS = 1e-6  # the tower's RMSNorms (transformers hard-codes it)


def vision_config(cfg: ModelConfig) -> dict:
  """The tower's hyperparameters and the image token ids of ``cfg``."""
  if cfg.vision is None:
    raise ValueError(f"model_type={cfg.model_type!r} has no vision tower (text-only config)")
  return dict(cfg.vision)


# --- the layout of a batch of images (host, numpy) ----------------------------------------------


class Layout(NamedTuple):
  """What the tower reads of the grid sizes, in the window order of the N patches.

  order [N]: the patch at each slot; windows [N], images [N]: the attention segment of each slot
  on the windowed and on the full-attention blocks; positions [N, 2]: (row, column) of each slot's
  patch in its image; unorder [N/4]: the merged token at each place of the image order.
  """
  order: np.ndarray
  windows: np.ndarray
  images: np.ndarray
  positions: np.ndarray
  unorder: np.ndarray


def patch_positions(grid_thw, merge: int) -> np.ndarray:
  """(row, column) [N, 2] of every patch in the processor's order: frame by frame, 2x2 blocks
  (``merge`` x ``merge``) row-major, the patches of a block row-major (``transformers``'
  ``get_vision_position_ids``)."""
  out = []
  for t, h, w in np.asarray(grid_thw, np.int64).tolist():
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    block = lambda a: a.reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3)
    out.append(np.tile(np.stack([block(rows).ravel(), block(cols).ravel()], -1), (t, 1)))
  return np.concatenate(out).astype(np.int32)


def window_order(grid_thw, merge: int, window: int) -> tuple[np.ndarray, np.ndarray]:
  """(order of the merged tokens [N/4], window id of each in that order): each frame's grid of
  merged tokens cut into ``window`` x ``window`` squares (the last ones smaller), read square by
  square, row-major within one (``transformers``' ``get_vision_window_index``)."""
  order, ids, base, next_id = [], [], 0, 0
  for t, h, w in np.asarray(grid_thw, np.int64).tolist():
    gh, gw = h // merge, w // merge
    index = np.arange(t * gh * gw).reshape(t, gh, gw)
    for f in range(t):
      for r in range(0, gh, window):
        for c in range(0, gw, window):
          cell = index[f, r:r + window, c:c + window].ravel()
          order.append(cell + base)
          ids.append(np.full(cell.size, next_id))
          next_id += 1
    base += t * gh * gw
  return np.concatenate(order), np.concatenate(ids)


def layout(grid_thw, vision: dict) -> Layout:
  """The ``Layout`` of images with grid sizes ``grid_thw`` [n_images, 3] (host arrays)."""
  grid = np.asarray(grid_thw, np.int64).reshape(-1, 3)
  merge, unit = vision["spatial_merge_size"], vision["spatial_merge_size"] ** 2
  if (grid[:, 1:] % merge).any():
    raise ValueError(f"image_grid_thw {grid.tolist()}: heights and widths must be multiples of "
                     f"spatial_merge_size={merge}")
  window = vision["window_size"] // merge // vision["patch_size"]
  merged, window_ids = window_order(grid, merge, window)
  order = (merged[:, None] * unit + np.arange(unit)).ravel()
  frames = np.repeat(np.arange(int(grid[:, 0].sum())), np.repeat(grid[:, 1] * grid[:, 2],
                                                                 grid[:, 0]))
  return Layout(order=order.astype(np.int32), windows=np.repeat(window_ids, unit).astype(np.int32),
                images=frames[order].astype(np.int32),
                positions=patch_positions(grid, merge)[order],
                unorder=np.argsort(merged).astype(np.int32))


# --- the tower (Flax NNX) -------------------------------------------------------------------------

def vision_rope(positions, head_dim: int, theta: float) -> layers.Rope:
  """2-D rotary cos/sin [N, Dh] of (row, column) ``positions`` [N, 2]: Dh/4 frequencies
  ``theta^(-4i/Dh)`` per axis, rows then columns, repeated for the two rotated halves."""
  half = head_dim // 2
  inv = 1.0 / theta ** (np.arange(0, half, 2, dtype=np.float32) / half)
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv, jnp.float32)
  freqs = freqs.reshape(positions.shape[0], -1)  # [N, Dh/2]: rows' then columns'
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return layers.Rope(jnp.cos(emb), jnp.sin(emb))


def segment_attention(q, k, v, segments):
  """Bidirectional attention of q, k, v [N, H, Dh] within equal ``segments`` [N] (softmax in
  float32): ``softmax(q k^T / sqrt(Dh) | same segment) v``."""
  scores = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=jnp.float32)
  scores = scores / np.float32(math.sqrt(q.shape[-1]))
  same = segments[:, None] == segments[None, :]
  probs = jax.nn.softmax(jnp.where(same[None], scores, -jnp.inf), axis=-1)
  return jnp.einsum("hqk,khd->qhd", probs.astype(v.dtype), v)


def _tower_cfg(cfg: ModelConfig, vision: dict, width: int) -> ModelConfig:
  """The settings the tower's shared blocks (``layers``) read: its widths, biases, activation and
  norm epsilon, no adapters, the model's dtypes."""
  return cfg.replace(hidden_size=vision["hidden_size"], intermediate_size=width, mlp_bias=True,
                     hidden_act=vision["hidden_act"], rms_norm_eps=_EPS, fused_mlp=False,
                     fused_qkv=False, lora_rank=0, lora_base_dtype=None)


def block_attention(block, x, rope: layers.Rope, segments):
  """A tower block's attention branch over patches ``x`` [N, D]: ``block.norm1``, the fused
  ``block.qkv`` split into ``block.num_heads`` heads, 2-D rotary positions ``rope``, attention
  within ``segments`` (``segment_attention``), ``block.proj``."""
  n, d = x.shape
  q, k, v = jnp.moveaxis(block.qkv(block.norm1(x)).reshape(n, 3, block.num_heads, -1), 1, 0)
  rope_b = layers.Rope(rope.cos[None], rope.sin[None])
  q, k = (layers.apply_rope(a.astype(jnp.float32)[None], rope_b)[0].astype(x.dtype)
          for a in (q, k))
  return block.proj(segment_attention(q, k, v, segments).reshape(n, d))


class VisionBlock(nnx.Module):
  """``x += proj(attn(rope(qkv(norm1(x))))); x += mlp(norm2(x))`` over one segment layout."""

  def __init__(self, tcfg: ModelConfig, num_heads: int, *, rngs: nnx.Rngs):
    d = tcfg.hidden_size
    self.norm1 = layers.RMSNorm(d, cfg=tcfg)
    self.norm2 = layers.RMSNorm(d, cfg=tcfg)
    self.qkv = layers.Linear(d, 3 * d, axes=("embed", "q_heads"), bias=True, cfg=tcfg, rngs=rngs)
    self.proj = layers.Linear(d, d, axes=("q_heads", "embed"), bias=True, cfg=tcfg, rngs=rngs)
    self.mlp = layers.GatedMLP(tcfg, rngs=rngs)
    self.num_heads = num_heads

  def __call__(self, x, rope: layers.Rope, segments):
    x = x + block_attention(self, x, rope, segments)
    return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
  """``mlp_2(gelu(mlp_0(ln_q(x).reshape(N / 4, 4 D))))``: each 2x2 block of patches (adjacent in
  the window order) to one token of the language model's width."""

  def __init__(self, tcfg: ModelConfig, unit: int, out: int, *, rngs: nnx.Rngs):
    d = tcfg.hidden_size
    self.ln_q = layers.RMSNorm(d, cfg=tcfg)
    self.mlp_0 = layers.Linear(unit * d, unit * d, axes=("embed", "mlp"), bias=True, cfg=tcfg,
                               rngs=rngs)
    self.mlp_2 = layers.Linear(unit * d, out, axes=("mlp", "embed"), bias=True, cfg=tcfg,
                               rngs=rngs)
    self.unit = unit

  def __call__(self, x):
    h = self.ln_q(x).reshape(x.shape[0] // self.unit, -1)
    return self.mlp_2(jax.nn.gelu(self.mlp_0(h), approximate=False))


def embed_patches(patch_embed, pixels, dtype):
  """pixels [N, C*T*P*P] through the patch embedding (its 3-D convolution of stride = kernel
  as a linear map) -> [N, D], in ``dtype``."""
  kernel = patch_embed.astype(dtype).reshape(patch_embed.shape[0], -1)
  if pixels.shape[-1] != kernel.shape[1]:
    raise ValueError(f"pixel patches of {pixels.shape[-1]} values; this tower takes "
                     f"{kernel.shape[1]} (channels x temporal_patch_size x patch_size^2)")
  return jnp.dot(pixels.astype(dtype), kernel.T)


class VisionTower(nnx.Module):
  """Qwen2.5-VL's image encoder (module doc): ``tower(pixels [N, P], layout arrays)`` ->
  ``[N / 4, D_text]`` in the image order (image by image, as their placeholders come)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    v = vision_config(cfg)
    d = v["hidden_size"]
    tcfg = _tower_cfg(cfg, v, v["intermediate_size"])
    patch = v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2
    pdt = jnp.dtype(cfg.param_dtype)
    # The Conv3d's weight as transformers stores it [D, C, T, P, P]: its stride equals its kernel,
    # so it is a linear map of the flattened patch.
    self.patch_embed = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (d, v["in_channels"], v["temporal_patch_size"],
                                                 v["patch_size"], v["patch_size"]), pdt),
        logical_axes=("embed", None, None, None, None))
    self.depth = v["depth"]
    for i in range(self.depth):
      setattr(self, f"blocks_{i}", VisionBlock(tcfg, v["num_heads"], rngs=rngs))
    self.merger = PatchMerger(tcfg, v["spatial_merge_size"] ** 2, cfg.hidden_size, rngs=rngs)
    self.full = tuple(int(i) for i in v["fullatt_block_indexes"])
    self.head_dim = d // v["num_heads"]
    self.theta = float(v["rope_theta"])
    self.dtype = jnp.dtype(cfg.dtype)

  def __call__(self, pixels, lay: Layout):
    """pixels [N, C*T*P*P]; ``lay``: ``layout(grid_thw)``'s arrays (host or device)."""
    x = embed_patches(self.patch_embed[...], pixels[lay.order], self.dtype)
    rope = vision_rope(jnp.asarray(lay.positions), self.head_dim, self.theta)
    for i in range(self.depth):
      segments = lay.images if i in self.full else lay.windows
      x = getattr(self, f"blocks_{i}")(x, rope, jnp.asarray(segments))
    return self.merger(x)[lay.unorder]


# --- the family: config.json and tensor names -----------------------------------------------------

def config_from_hf(hf) -> dict:
  """Both layouts of config.json: the text model's keys at the top (transformers < 4.52) or in
  ``text_config``; the rotary sections in ``rope_parameters`` or ``rope_scaling`` ('mrope')."""
  top = {k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}
  text = {**dict(hf.get("text_config") or {}), **top}
  if text.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act={text['hidden_act']!r}; only 'silu' (SwiGLU)")
  if text.get("use_sliding_window"):
    raise ValueError("Qwen2.5-VL with use_sliding_window=True is not supported")
  rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
  section = rope.pop("mrope_section", None)
  if section is None:
    raise ValueError("no mrope_section in rope_parameters / rope_scaling: M-RoPE needs it")
  if rope.pop("type", rope.get("rope_type")) in ("mrope", "default", None):
    rope["rope_type"] = "default"
  text.pop("rope_scaling", None)
  vision = {k: hf.get("vision_config", {}).get(k, d) for k, d in VISION_DEFAULTS.items()}
  vision["rope_theta"] = (hf.get("vision_config", {}).get("rope_parameters") or {}).get(
      "rope_theta", vision["rope_theta"])
  vision.update({k: int(hf.get(k, text.get(k, d))) for k, d in TOKEN_IDS.items()})
  if vision["out_hidden_size"] != text["hidden_size"]:
    raise ValueError(f"vision_config.out_hidden_size={vision['out_hidden_size']} differs from the "
                     f"text model's hidden_size={text['hidden_size']}")
  return dict(common_from_hf(dict(text, rope_parameters=rope)), qkv_bias=True, o_bias=False,
              mrope_section=tuple(section), vision=vision)


def config_to_hf(cfg: ModelConfig) -> dict:
  """config.json in the layout of ``transformers`` >= 5 (a ``text_config`` and a
  ``vision_config``)."""
  v = vision_config(cfg)
  text = common_to_hf(cfg, ARCHITECTURE)
  del text["architectures"], text["rope_scaling"]
  text.update(model_type="qwen2_5_vl_text", hidden_act="silu", use_sliding_window=False,
              sliding_window=None,
              rope_parameters=dict(text["rope_parameters"], mrope_section=list(cfg.mrope_section)))
  vision = {k: v[k] for k in VISION_DEFAULTS if k != "rope_theta"}
  vision.update(model_type="qwen2_5_vl_vision", fullatt_block_indexes=list(vision[
      "fullatt_block_indexes"]), rope_parameters={"rope_type": "axial",
                                                  "rope_theta": v["rope_theta"]})
  return dict(architectures=[ARCHITECTURE], model_type=MODEL_TYPE, text_config=text,
              vision_config=vision, tie_word_embeddings=cfg.tie_embeddings,
              **{k: v[k] for k in TOKEN_IDS})


def tower_tensors(cfg: ModelConfig) -> dict:
  """``visual.*`` -> (path under ``visual``, transpose, None)."""
  out = {"visual.patch_embed.proj.weight": (("visual", "patch_embed"), False, None),
         "visual.merger.ln_q.weight": (("visual", "merger", "ln_q", "scale"), False, None)}
  for n in ("0", "2"):
    out[f"visual.merger.mlp.{n}.weight"] = (("visual", "merger", f"mlp_{n}", "kernel"), True, None)
    out[f"visual.merger.mlp.{n}.bias"] = (("visual", "merger", f"mlp_{n}", "bias"), False, None)
  for i in range(vision_config(cfg)["depth"]):
    block, at = f"visual.blocks.{i}.", ("visual", f"blocks_{i}")
    for n in ("norm1", "norm2"):
      out[f"{block}{n}.weight"] = (at + (n, "scale"), False, None)
    for hf_name, ours in (("attn.qkv", ("qkv",)), ("attn.proj", ("proj",)),
                          ("mlp.gate_proj", ("mlp", "gate_proj")),
                          ("mlp.up_proj", ("mlp", "up_proj")),
                          ("mlp.down_proj", ("mlp", "down_proj"))):
      out[f"{block}{hf_name}.weight"] = (at + ours + ("kernel",), True, None)
      out[f"{block}{hf_name}.bias"] = (at + ours + ("bias",), False, None)
  return out


def rename(name: str) -> str:
  """transformers 4.52-4.57 wrote ``model.visual.*`` and ``model.language_model.*``; the export
  writes what transformers 4.49-4.51 and >= 5 write: ``visual.*`` and ``model.*``."""
  if name.startswith("model.visual."):
    return name[len("model."):]
  if name.startswith("model.language_model."):
    return "model." + name[len("model.language_model."):]
  return name


def module_name(name: str) -> str:
  """The export's name -> the module tree's of transformers >= 4.52 (``model.visual.*``,
  ``model.language_model.*``; ``lm_head`` as it is): PEFT's adapter names."""
  if name.startswith("visual."):
    return "model." + name
  if name.startswith("model."):
    return "model.language_model." + name[len("model."):]
  return name


# A fresh tiny model's tower (``model.source='tiny'``): its sizes are the ``model.vision.*`` keys;
# the last block attends over the whole image, the others within windows of Qwen's 112 pixels; the
# processor's patches are merged 2x2.
TINY_VISION_KEYS = ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size")


def mrope_sections(head_dim: int) -> tuple:
  """Qwen's split of the Dh/2 rotary frequencies (16, 24, 24 of 64) for another head size:
  a quarter temporal, the rest halved between height and width."""
  half = head_dim // 2
  t = half // 4
  return (t, (half - t) // 2, half - t - (half - t) // 2)


def tiny_fields(model_section, fields) -> dict:
  """A tiny tower, M-RoPE sections for the head size, and the placeholders as the last three ids
  of the vocabulary in the order ``data.tokenizer='char_vl'`` appends them (vision start, image
  pad, vision end); no video token (one past the vocabulary)."""
  v = fields["vocab_size"]
  sizes = {k: int(model_section.vision[k]) for k in TINY_VISION_KEYS}
  width, heads = sizes["hidden_size"], sizes["num_heads"]
  if width % heads or (width // heads) % 4:
    # 2-D rotary positions: a quarter of each head's dimensions per axis and rotated half.
    raise ConfigError(f"model.vision.hidden_size={width} with model.vision.num_heads={heads}: "
                      "the tower's head size (width / heads) must be a whole multiple of 4")
  vision = dict(VISION_DEFAULTS, **sizes, fullatt_block_indexes=(sizes["depth"] - 1,),
                out_hidden_size=fields["hidden_size"], vision_start_token_id=v - 3,
                image_token_id=v - 2, vision_end_token_id=v - 1, video_token_id=v)
  return dict(qkv_bias=True, mrope_section=mrope_sections(fields["head_dim"]), vision=vision)


register_family(Family(
    name=MODEL_TYPE, model_types=(MODEL_TYPE,), block=PreNormBlock,
    final_norm=lambda dim, cfg: layers.RMSNorm(dim, cfg=cfg), config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, layer_tensors=lambda cfg, layer: dense_tensors(cfg),
    tower=VisionTower, extra_tensors=tower_tensors, rename=rename, module_name=module_name,
    tiny_fields=tiny_fields))

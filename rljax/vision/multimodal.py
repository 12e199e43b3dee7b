"""A batch with images through a vision-language model: 3-D positions, merged embeddings, forward.

The host turns the token rows and the images' grid sizes into M-RoPE positions [3, B, S]
(``rope_index``) and each row's own images, patches and tower ``Layout`` padded to one shape
(``row_images``: ``RowImages``, so rows shard, chunk and repeat as tokens do); the jitted
forward runs the tower over each row's patches (-> [N / 4, D] in image order), puts the features
at the row's image placeholders in order (``merge_images``) and runs the one network on those
embeddings at those positions (``forward_rows``). Rows without images are text rows: their
three position components are equal, which is plain RoPE.

Gemma 3 (``gemma3_vl``) takes fixed-size images and plain positions (one component, [R, 1, S]);
its language model lets the soft tokens of one image attend to each other in both directions
(``image_blocks``, ``block_attend``: the training forward and the sampler's prefill).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import kv_cache, transformer
from rljax.models.config import ModelConfig
from rljax.vision import gemma3_vl, qwen2_5_vl, qwen3_vl

# The tower module of each vision-language model_type; a module with ``BLOCK_ATTENTION`` lets
# an image's tokens attend to each other both ways.
_TOWERS = {qwen2_5_vl.MODEL_TYPE: qwen2_5_vl, gemma3_vl.MODEL_TYPE: gemma3_vl,
           qwen3_vl.MODEL_TYPE: qwen3_vl}


def tower_module(cfg: ModelConfig):
  """The ``rljax.vision`` module of ``cfg``'s tower; a text-only config is one ``ValueError``."""
  if cfg.vision is None or cfg.model_type not in _TOWERS:
    raise ValueError(f"model_type={cfg.model_type!r} has no vision tower (text-only config)")
  return _TOWERS[cfg.model_type]


def rope_index(tokens, mask, grid_thw, vision: dict) -> tuple[np.ndarray, np.ndarray]:
  """M-RoPE positions [3, B, S] int32 and each row's delta [B] (``transformers``'
  ``get_rope_index`` for images).

  Over each row's real tokens (``mask``; padding gets 0): a text token at ``p`` is ``(p, p, p)``
  and advances ``p`` by 1; an image of grid ``(t, h, w)`` (its ``t * h/m * w/m`` placeholders,
  ``m`` the merge size) takes ``(p + i, p + r, p + c)`` at frame ``i``, row ``r``, column ``c``
  of its merged grid and advances ``p`` by ``max(h, w) / m``. The images are consumed in order
  over the rows. ``delta = max position + 1 - real tokens``: a token generated after the row sits
  at its index plus ``delta``. Placeholders that do not match the images' sizes are an error.
  """
  tokens, mask = np.asarray(tokens), np.asarray(mask).astype(bool)
  grids = [tuple(int(x) for x in g) for g in np.asarray(grid_thw).reshape(-1, 3)]
  merge, image = vision["spatial_merge_size"], vision["image_token_id"]
  positions = np.zeros((3,) + tokens.shape, np.int32)
  deltas = np.zeros(tokens.shape[0], np.int32)
  used = 0
  for b in range(tokens.shape[0]):
    ids = tokens[b][mask[b]]
    out, i, p = [], 0, 0
    while i < len(ids):
      if ids[i] != image:
        j = i
        while j < len(ids) and ids[j] != image:
          j += 1
        out.append(np.broadcast_to(np.arange(p, p + j - i), (3, j - i)))
        p, i = p + j - i, j
        continue
      if used == len(grids):
        raise ValueError(f"row {b} has more image placeholders than the {len(grids)} images")
      t, h, w = grids[used]
      h, w = h // merge, w // merge
      n = t * h * w
      if not (ids[i:i + n] == image).all() or (i + n < len(ids) and ids[i + n] == image):
        run = int(np.argmin(np.append(ids[i:] == image, False)))
        raise ValueError(f"row {b}: image {used} of grid {grids[used]} needs {n} placeholder "
                         f"tokens, found a run of {run}")
      grid = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
      out.append(np.stack([g.ravel() for g in grid]) + p)
      p, i, used = p + max(h, w), i + n, used + 1
    row = np.concatenate(out, axis=1) if out else np.zeros((3, 0), np.int32)
    positions[:, b, mask[b]] = row
    deltas[b] = (row.max() + 1 if row.size else 0) - len(ids)
  if used != len(grids):
    raise ValueError(f"{len(grids)} images but placeholders for {used}")
  return positions, deltas


def merge_images(x, tokens, image_token_id: int, features):
  """``x`` [B, S, D] with the k-th image placeholder of ``tokens`` [B, S] (row-major) replaced by
  ``features[k]`` ([N_tokens, D], in image order)."""
  is_image = tokens == image_token_id
  k = jnp.cumsum(is_image.reshape(-1)).reshape(tokens.shape) - 1
  at = jnp.take(features.astype(x.dtype), jnp.clip(k, 0, features.shape[0] - 1), axis=0)
  return jnp.where(is_image[..., None], at, x)


def image_features(cfg: ModelConfig, params: dict, pixels, lay: qwen2_5_vl.Layout):
  """The tower over every image of a batch: pixel patches [N, P] -> [N / 4, D] (image order;
  Qwen3-VL: with its DeepStack features [K, N / 4, D])."""
  return transformer.bind(cfg, params).visual(pixels, lay)


# --- each row's own images: the sampler's and the learner's format ------------------------------

class RowImages(NamedTuple):
  """Each row's images, padded to one shape so rows shard, chunk and repeat like tokens.

  pixels [R, N, P]: the row's patches (its images in placeholder order), zero-padded to N;
  layout: the row's ``Layout`` ([R, N], positions [R, N, 2], unorder [R, N/4]); a padding patch
  is its own segment (-1) and merges into a token no placeholder reads; positions [R, 3, S]: the
  row's M-RoPE positions over its ``S`` prompt slots."""
  pixels: jax.Array
  layout: qwen2_5_vl.Layout  # or the tower's own (Qwen3-VL), None (Gemma 3)
  positions: jax.Array


def _pad_layout(lay, n: int, unit: int):
  """``lay`` (a tower's ``Layout``) of ``len(lay.order)`` patches padded to ``n``: the padding
  patches in place (``order``, ``unorder`` go on counting), each its own segment (-1), other
  fields 0."""
  have = len(lay.order)
  def pad(name, a):
    if name in ("order", "unorder"):
      scale = 1 if name == "order" else unit
      return np.concatenate([a, np.arange(have // scale, n // scale, dtype=a.dtype)])
    fill = -1 if name in ("windows", "images") else 0
    return np.concatenate([a, np.full((n - have,) + a.shape[1:], fill, a.dtype)])
  return type(lay)(*(pad(name, a) for name, a in zip(lay._fields, lay)))


def row_images(cfg: ModelConfig, tokens, mask, pixels, grid_thw=None,
               bucket: int = 16) -> RowImages:
  """Host side: ``RowImages`` of left-padded rows ``tokens`` [R, S] whose placeholders take the
  images of ``grid_thw`` [n_images, 3] in order (``pixel_values`` [sum N, P] as the processor
  returns them); each row's patches padded to a multiple of ``bucket`` (one compilation per
  bucket). Placeholders that do not match the images are one ``ValueError`` (``rope_index``).
  Gemma 3: ``pixel_values`` [n_images, C, H, H], no grid (``fixed_row_images``)."""
  if tower_module(cfg) is gemma3_vl:
    if grid_thw is not None:
      raise ValueError("Gemma 3's images all have one size: pass no image_grid_thw")
    return fixed_row_images(cfg, tokens, mask, pixels)
  if grid_thw is None:
    raise ValueError(f"model_type={cfg.model_type!r} needs the images' image_grid_thw")
  tower = tower_module(cfg)
  vision = tower.vision_config(cfg)
  tokens, grid = np.asarray(tokens), np.asarray(grid_thw, np.int64).reshape(-1, 3)
  positions, _ = rope_index(tokens, mask, grid, vision)
  unit = vision["spatial_merge_size"] ** 2
  patches = np.prod(grid, axis=1)
  starts = np.r_[0, np.cumsum(patches)]
  held = ((tokens == vision["image_token_id"]) & np.asarray(mask).astype(bool)).sum(1)
  rows, first = [], 0
  for count in held:  # the images whose placeholders fill this row (rope_index checked them)
    last = first
    while count > 0:
      count -= patches[last] // unit
      last += 1
    rows.append((first, last))
    first = last
  n = max([int(starts[b] - starts[a]) for a, b in rows] + [unit])
  n = -(-n // bucket) * bucket
  pixels = np.asarray(pixels, np.float32)
  out_pixels = np.zeros((len(rows), n, pixels.shape[-1]), np.float32)
  lays = []
  for r, (a, b) in enumerate(rows):
    out_pixels[r, :starts[b] - starts[a]] = pixels[starts[a]:starts[b]]
    lays.append(_pad_layout(tower.layout(grid[a:b], vision) if b > a else empty(tower, vision),
                            n, unit))
  layout = type(lays[0])(*(np.stack(field) for field in zip(*lays)))
  return RowImages(out_pixels, layout, np.moveaxis(positions, 0, 1))


def fixed_row_images(cfg: ModelConfig, tokens, mask, pixels) -> RowImages:
  """``RowImages`` of a tower whose images are all one size (Gemma 3): pixels [R, M, C, H, H],
  each row's images in placeholder order, zero-padded to the most any row holds (M >= 1; a
  padding image's tokens are read by no placeholder); no layout; positions [R, 1, S] plain,
  ``cumsum(mask) - 1`` (0 on padding). Each image stands as ``mm_tokens_per_image``
  placeholders; counts that do not match the images are one ``ValueError``."""
  vision = gemma3_vl.vision_config(cfg)
  tokens, mask = np.asarray(tokens), np.asarray(mask).astype(bool)
  pixels = np.asarray(pixels, np.float32)
  if pixels.ndim != 4:
    raise ValueError(f"pixel_values of shape {pixels.shape}: Gemma 3 takes [images, C, H, W]")
  per = vision["mm_tokens_per_image"]
  held = ((tokens == vision["image_token_id"]) & mask).sum(1)
  if (held % per).any():
    row = int(np.flatnonzero(held % per)[0])
    raise ValueError(f"row {row} has {held[row]} image placeholders; each image takes "
                     f"mm_tokens_per_image={per}")
  counts = held // per
  if counts.sum() != len(pixels):
    raise ValueError(f"{len(pixels)} images but placeholders for {int(counts.sum())}")
  out = np.zeros((len(tokens), max(int(counts.max(initial=0)), 1)) + pixels.shape[1:], np.float32)
  starts = np.r_[0, np.cumsum(counts)]
  for r, n in enumerate(counts):
    out[r, :n] = pixels[starts[r]:starts[r] + n]
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)[:, None]
  return RowImages(out, None, positions)


def empty(tower, vision: dict):
  """The ``Layout`` of no patches of ``tower`` (a row without images)."""
  merge = vision["spatial_merge_size"]
  one = tower.layout(np.array([[1, merge, merge]]), vision)
  return type(one)(*(a[:0] for a in one))


def image_blocks(tokens, valid, image_id: int):
  """[B, S] int32: ``k`` on the k-th run of image placeholders of a row (one image's soft
  tokens), 0 elsewhere (``transformers``' ``get_block_sequence_ids_for_mask`` plus one)."""
  is_image = (tokens == image_id) & valid.astype(bool)
  before = jnp.pad(is_image[:, :-1], ((0, 0), (1, 0)))
  return jnp.where(is_image, jnp.cumsum(is_image & ~before, axis=1), 0).astype(jnp.int32)


def block_attend(blocks, kv_valid):
  """The attention strategy (``layers.Attend``) of a forward over its own S tokens (no cache,
  or a prefill written at slot 0 of an empty one) where the tokens of one image block
  (``blocks`` [B, S]) see each other both ways (Gemma 3):

      allowed[q, k] = (k <= q  or  blocks[q] == blocks[k] > 0)  and  q - k < window
                      and  kv_valid[k]

  (``transformers``: causal OR blockwise, AND the sliding window on local layers). A dense
  masked softmax over [S, S] (``kv_cache.cache_attention``): prompts with a few images."""
  def allowed(window, s):
    i = jnp.arange(s)
    ok = (i[None, :] <= i[:, None])[None] | ((blocks[:, :, None] == blocks[:, None, :])
                                             & (blocks[:, :, None] > 0))
    if window is not None:
      ok = ok & (i[:, None] - i[None, :] < window)[None]
    return ok & kv_valid[:, None, :s].astype(bool)

  def attend(q, k, v, layer_cache, window):
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # head-major [B, G, S, Dh]
    if layer_cache is not None:
      layer_cache = tuple(jax.lax.dynamic_update_slice(c, x.astype(c.dtype), (0, 0, 0, 0))
                          for c, x in zip(layer_cache, (kh, vh)))
    mask = allowed(window, k.shape[1])[:, None, None, k.shape[1] - q.shape[1]:]
    out = kv_cache.cache_attention(q, kh.astype(q.dtype), vh.astype(q.dtype), mask)
    return out, layer_cache
  return attend


def prefill_attend(cfg: ModelConfig, prompt_tokens, prompt_mask):
  """The sampler's prefill strategy for prompts with images: ``block_attend`` where the family
  lets an image's tokens see each other both ways (Gemma 3), else None (the cache's own)."""
  tower = tower_module(cfg)
  if not getattr(tower, "BLOCK_ATTENTION", False):
    return None
  image_id = tower.vision_config(cfg)["image_token_id"]
  valid = prompt_mask[:, :prompt_tokens.shape[1]]  # a cache's mask may run past the prompts
  return block_attend(image_blocks(prompt_tokens, valid, image_id), prompt_mask)


def row_embeddings(cfg: ModelConfig, model, tokens, images: RowImages):
  """(input embeddings [R, S', D], DeepStack additions [R, K, S', D] or None) of rows ``tokens``
  [R, S'] (S' >= the images' S prompt slots): the tower over each row's own patches, its
  features at the row's placeholders among the first S slots (a placeholder id the policy
  generated later is embedded as a token, as the sampler fed it). A tower that also returns
  features of its middle layers (Qwen3-VL's DeepStack, [K, N_tokens, D]) has them placed at the
  same placeholders, 0 elsewhere."""
  image_id = tower_module(cfg).vision_config(cfg)["image_token_id"]
  out = jax.vmap(lambda px, lay: model.visual(px, lay))(images.pixels, images.layout)
  features, deep = out if isinstance(out, tuple) else (out, None)
  x = model.embed(tokens)
  s = images.positions.shape[-1]
  place = lambda x, f: jax.vmap(lambda x, t, f: merge_images(x[None], t[None], image_id, f)[0])(
      x, tokens[:, :s], f)
  merged = jnp.concatenate([place(x[:, :s], features), x[:, s:]], axis=1)
  if deep is None:
    return merged, None
  zeros = jnp.zeros_like(x)
  added = jnp.stack([jnp.concatenate([place(zeros[:, :s], deep[:, k]), zeros[:, s:]], axis=1)
                     for k in range(deep.shape[1])], axis=1)
  return merged, added


def row_positions(images: RowImages, width: int):
  """M-RoPE positions [3, R, width] (Gemma 3: [1, R, width]) of prompts followed by
  ``width - S`` generated tokens: those continue from each prompt's largest position + 1 (text:
  equal components)."""
  prompt = jnp.asarray(images.positions, jnp.int32)
  after = prompt.max(axis=(1, 2))[:, None] + 1 + jnp.arange(width - prompt.shape[-1])
  full = jnp.concatenate([prompt, jnp.broadcast_to(after[:, None], prompt.shape[:2]
                                                   + after.shape[1:])], axis=-1)
  return jnp.moveaxis(full, 1, 0)


def forward_rows(cfg: ModelConfig, params: dict, tokens, attn_mask, images: RowImages,
                 head: str = "lm"):
  """The teacher-forced forward of rows with their images (``RowImages`` of their prompts):
  (hidden [R, S', D] after the final norm, the bound module). ``attn_mask``: 0/1 [R, S']."""
  model = transformer.bind(cfg, params, head)
  x, deepstack = row_embeddings(cfg, model, tokens, images)
  s = images.positions.shape[-1]
  attend = prefill_attend(cfg, jnp.pad(tokens[:, :s], ((0, 0), (0, tokens.shape[1] - s)),
                                                  constant_values=-1),
                          attn_mask)  # blocks among the prompt's placeholders only
  if attend is None:
    attend = transformer.self_attention(cfg, attn_mask)
  hidden, _, _ = model(tokens, row_positions(images, tokens.shape[1]), attend, embeds=x,
                       valid=attn_mask > 0,
                       deepstack=None if deepstack is None else jnp.moveaxis(deepstack, 1, 0))
  return hidden, model


def logits(cfg: ModelConfig, params: dict, tokens, attn_mask, images: RowImages):
  """Logits [R, S', V] of rows with their images (tests and small models only)."""
  hidden, model = forward_rows(cfg, params, tokens, attn_mask, images)
  return model.logits(hidden)

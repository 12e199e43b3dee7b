"""A batch with images through a vision-language model: 3-D positions, merged embeddings, forward.

The host turns the token rows and the images' grid sizes into M-RoPE positions [3, B, S]
(``rope_index``) and each row's own images, patches and tower ``Layout`` padded to one shape
(``row_images``: ``RowImages``, so rows shard, chunk and repeat as tokens do); the jitted
forward runs the tower over each row's patches (-> [N / 4, D] in image order), puts the features
at the row's image placeholders in order (``merge_images``) and runs the one network on those
embeddings at those positions (``forward_rows``). Rows without images are text rows: their
three position components are equal, which is plain RoPE.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import transformer
from rljax.models.config import ModelConfig
from rljax.vision import qwen2_5_vl


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
  """The tower over every image of a batch: pixel patches [N, P] -> [N / 4, D] (image order)."""
  return transformer.bind(cfg, params).visual(pixels, lay)


# --- each row's own images: the sampler's and the learner's format ------------------------------

class RowImages(NamedTuple):
  """Each row's images, padded to one shape so rows shard, chunk and repeat like tokens.

  pixels [R, N, P]: the row's patches (its images in placeholder order), zero-padded to N;
  layout: the row's ``Layout`` ([R, N], positions [R, N, 2], unorder [R, N/4]); a padding patch
  is its own segment (-1) and merges into a token no placeholder reads; positions [R, 3, S]: the
  row's M-RoPE positions over its ``S`` prompt slots."""
  pixels: jax.Array
  layout: qwen2_5_vl.Layout
  positions: jax.Array


def _pad_layout(lay: qwen2_5_vl.Layout, n: int, unit: int) -> qwen2_5_vl.Layout:
  have = len(lay.order)
  pad = lambda a, fill: np.concatenate([a, np.full((n - have,) + a.shape[1:], fill, a.dtype)])
  return qwen2_5_vl.Layout(
      order=np.concatenate([lay.order, np.arange(have, n, dtype=np.int32)]),
      windows=pad(lay.windows, -1), images=pad(lay.images, -1), positions=pad(lay.positions, 0),
      unorder=np.concatenate([lay.unorder, np.arange(have // unit, n // unit, dtype=np.int32)]))


def row_images(cfg: ModelConfig, tokens, mask, pixels, grid_thw, bucket: int = 16) -> RowImages:
  """Host side: ``RowImages`` of left-padded rows ``tokens`` [R, S] whose placeholders take the
  images of ``grid_thw`` [n_images, 3] in order (``pixel_values`` [sum N, P] as the processor
  returns them); each row's patches padded to a multiple of ``bucket`` (one compilation per
  bucket). Placeholders that do not match the images are one ``ValueError`` (``rope_index``)."""
  vision = qwen2_5_vl.vision_config(cfg)
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
    empty = qwen2_5_vl.Layout(*(np.zeros((0,) + s, np.int32) for s in ((), (), (), (2,), ())))
    lays.append(_pad_layout(qwen2_5_vl.layout(grid[a:b], vision) if b > a else empty, n, unit))
  layout = qwen2_5_vl.Layout(*(np.stack(field) for field in zip(*lays)))
  return RowImages(out_pixels, layout, np.moveaxis(positions, 0, 1))


def row_embeddings(cfg: ModelConfig, model, tokens, images: RowImages):
  """Input embeddings [R, S', D] of rows ``tokens`` [R, S'] (S' >= the images' S prompt slots):
  the tower over each row's own patches, its features at the row's placeholders among the first
  S slots (a placeholder id the policy generated later is embedded as a token, as the sampler
  fed it)."""
  image_id = qwen2_5_vl.vision_config(cfg)["image_token_id"]
  features = jax.vmap(lambda px, lay: model.visual(px, lay))(images.pixels, images.layout)
  x = model.embed(tokens)
  s = images.positions.shape[-1]
  merged = jax.vmap(lambda x, t, f: merge_images(x[None], t[None], image_id, f)[0])(
      x[:, :s], tokens[:, :s], features)
  return jnp.concatenate([merged, x[:, s:]], axis=1)


def row_positions(images: RowImages, width: int):
  """M-RoPE positions [3, R, width] of prompts followed by ``width - S`` generated tokens: those
  continue from each prompt's largest position + 1 (text: three equal components)."""
  prompt = jnp.asarray(images.positions, jnp.int32)
  after = prompt.max(axis=(1, 2))[:, None] + 1 + jnp.arange(width - prompt.shape[-1])
  full = jnp.concatenate([prompt, jnp.broadcast_to(after[:, None], (prompt.shape[0], 3,
                                                                  after.shape[1]))], axis=-1)
  return jnp.moveaxis(full, 1, 0)


def forward_rows(cfg: ModelConfig, params: dict, tokens, attn_mask, images: RowImages,
                 head: str = "lm"):
  """The teacher-forced forward of rows with their images (``RowImages`` of their prompts):
  (hidden [R, S', D] after the final norm, the bound module). ``attn_mask``: 0/1 [R, S']."""
  model = transformer.bind(cfg, params, head)
  x = row_embeddings(cfg, model, tokens, images)
  hidden, _, _ = model(tokens, row_positions(images, tokens.shape[1]),
                       transformer.self_attention(cfg, attn_mask), embeds=x, valid=attn_mask > 0)
  return hidden, model


def logits(cfg: ModelConfig, params: dict, tokens, attn_mask, images: RowImages):
  """Logits [R, S', V] of rows with their images (tests and small models only)."""
  hidden, model = forward_rows(cfg, params, tokens, attn_mask, images)
  return model.logits(hidden)

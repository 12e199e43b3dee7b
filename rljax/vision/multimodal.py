"""A batch with images through a vision-language model: 3-D positions, merged embeddings, forward.

The host turns the token rows and the images' grid sizes into M-RoPE positions [3, B, S]
(``rope_index``) and the tower's ``Layout``; the jitted forward runs the tower once over every
image of the batch (``image_features``: pixel patches [N, P] -> [N / 4, D] in image order),
puts the features at the image placeholder tokens in row-major order (``merge_images``) and runs
the one network on those embeddings at those positions. Rows without images are text rows:
their three position components are equal, which is plain RoPE.
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


def forward(cfg: ModelConfig, params: dict, tokens, attn_mask, positions, features=None):
  """Hidden states [B, S, D] after the final norm of rows ``tokens`` [B, S] (``attn_mask`` 0/1)
  at M-RoPE ``positions`` [3, B, S], with ``features`` (``image_features``; None: no images)
  at the image placeholders. Returns (hidden, the bound module)."""
  model = transformer.bind(cfg, params)
  x = model.embed(tokens)
  if features is not None:
    x = merge_images(x, tokens, qwen2_5_vl.vision_config(cfg)["image_token_id"], features)
  hidden, _, _ = model(tokens, positions, transformer.self_attention(cfg, attn_mask), embeds=x,
                       valid=attn_mask > 0)
  return hidden, model


def logits(cfg: ModelConfig, params: dict, tokens, attn_mask, positions, pixels=None, lay=None):
  """Logits [B, S, V] of a batch with images (``pixels`` and their ``layout``; None: none)."""
  features = None if pixels is None else image_features(cfg, params, pixels, lay)
  hidden, model = forward(cfg, params, tokens, attn_mask, positions, features)
  return model.logits(hidden)


# --- prompts with images for the sampler ---------------------------------------------------------

class PromptImages(NamedTuple):
  """The images of a batch of prompts as the sampler takes them (``prompt_images``): the pixel
  patches [N, P] of every image in placeholder order, their tower ``Layout``, and the prompts'
  M-RoPE positions [3, Pn, P]."""
  pixels: jax.Array
  layout: qwen2_5_vl.Layout
  positions: jax.Array


def prompt_images(cfg: ModelConfig, tokens, mask, pixels, grid_thw) -> PromptImages:
  """Host side: the layout and positions of left-padded prompts ``tokens`` [Pn, P] with images
  of grid sizes ``grid_thw`` (placeholders checked against them, ``rope_index``)."""
  vision = qwen2_5_vl.vision_config(cfg)
  positions, _ = rope_index(tokens, mask, grid_thw, vision)
  return PromptImages(np.asarray(pixels), qwen2_5_vl.layout(grid_thw, vision), positions)


def prompt_embeddings(cfg: ModelConfig, params: dict, tokens, images: PromptImages):
  """Input embeddings [Pn, P, D] of the prompts: the tower run once over all their images, the
  features merged at the placeholders. The sampler prefills these and shares the cache among a
  prompt's group, so the tower runs once per prompt, not per completion."""
  model = transformer.bind(cfg, params)
  features = model.visual(images.pixels, images.layout)
  return merge_images(model.embed(tokens), tokens, qwen2_5_vl.vision_config(cfg)["image_token_id"],
                      features)

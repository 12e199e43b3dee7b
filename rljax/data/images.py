"""Images in prompts: the pixels a problem carries and what a vision-language policy takes of them.

A problem with images (``Problem.images``, a tuple of ``Image``) writes one ``<image>`` marker
(``IMAGE_MARKER``) in its prompt text where each image goes, in order. Text-only paths never look
at ``images``; a prompt batch with images is encoded by ``encode_image_prompts`` in the family's
``ImageFormat`` (``image_format``) into what Hugging Face's processors give the model:

- Qwen2-VL / Qwen2.5-VL / Qwen3-VL (arXiv 2409.12191, 2502.13923): per image, the image
  processor's ``pixel_values`` patches ``[N_patches, C * temporal_patch_size * patch_size^2]``
  and ``image_grid_thw`` ``[3]`` (``(t, h, w)`` in patches; 14-pixel patches, or Qwen3-VL's 16);
  in the prompt's ids each marker becomes ``<|vision_start|>`` + ``<|image_pad|>`` x n +
  ``<|vision_end|>``, ``n = t * h * w / merge_size^2`` (the tokens the tower's patch merger emits);
- Gemma 3: per image, ``[C, H, H]`` pixels resized to the tower's ``image_size``; each marker
  becomes ``\n\n<start_of_image>`` + ``<image_soft_token>`` x ``mm_tokens_per_image`` +
  ``<end_of_image>\n\n`` (``Gemma3Processor``'s ``full_image_sequence``).

rljax does not re-implement resizing: the pixels are Hugging Face's image processor's.

Images come from files (a path, relative to the data file's folder), base64 strings (bare, or a
``data:image/...;base64,`` URL), PIL images or ``{'bytes', 'path'}`` dicts (Hugging Face
``datasets``' image feature); each is decoded when the row is read, so a missing or corrupt image
is an error naming the row at start-up.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import io
import os
import re
from typing import Any, Sequence

import numpy as np

from rljax.data.prompt_policy import where
from rljax.data.tokenizer import QWEN2_VL, Placeholders
from rljax.errors import DataError, MissingPackageError, TokenizerError

IMAGE_MARKER = "<image>"
_BASE64 = re.compile(r"[A-Za-z0-9+/\s]+={0,2}\s*")
_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,(.*)", re.S)


@dataclasses.dataclass(frozen=True)
class Image:
  """An RGB image ``[height, width, 3]`` uint8, held as bytes so that a problem that carries it
  stays a hashable, comparable value."""
  height: int
  width: int
  data: bytes = dataclasses.field(repr=False)

  @classmethod
  def from_array(cls, pixels) -> "Image":
    """From ``[H, W, 3]`` uint8 pixels."""
    pixels = np.asarray(pixels)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
      raise ValueError(f"an image is [H, W, 3] uint8 pixels, got {pixels.shape} {pixels.dtype}")
    return cls(int(pixels.shape[0]), int(pixels.shape[1]), pixels.tobytes())

  @property
  def pixels(self) -> np.ndarray:
    """``[H, W, 3]`` uint8 (read-only)."""
    return np.frombuffer(self.data, np.uint8).reshape(self.height, self.width, 3)

  def to_pil(self):
    return _pil().fromarray(self.pixels.copy(), "RGB")


def images_digest(images: Sequence[Image]) -> str:
  """A short stable digest of ``images`` ('' for none): with the prompt, what tells two rows
  apart (the same question asked of two figures is two problems)."""
  if not images:
    return ""
  digest = hashlib.blake2b(digest_size=8)
  for image in images:
    digest.update(f"{image.height}x{image.width};".encode() + image.data)
  return digest.hexdigest()


def row_key(problem) -> str:
  """What tells rows apart and splits them into train and held out (``is_eval_prompt``): the
  prompt, and the digest of its images when it shows any (text rows keep their split)."""
  images = tuple(getattr(problem, "images", ()))
  return problem.prompt if not images else f"{problem.prompt}\0{images_digest(images)}"


def _pil():
  try:
    from PIL import Image as PILImage  # the optional [vision] extra: images only
    return PILImage
  except ImportError:
    raise MissingPackageError("images need Pillow to be decoded and processed: pip install "
                              "pillow (the [vision] extra)") from None


def _decode(raw: bytes, what: str, where_: str) -> Image:
  pil = _pil()
  try:
    with pil.open(io.BytesIO(raw)) as opened:
      opened.load()  # a truncated file fails here, not at the first batch
      return Image.from_array(np.asarray(opened.convert("RGB")))
  except (OSError, ValueError, pil.DecompressionBombError) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise DataError(f"{where_}: {what} is not a readable image ({first})") from None


def _is_base64(ref: str) -> bool:
  return _DATA_URL.fullmatch(ref) is not None or (len(ref) >= 64
                                                   and _BASE64.fullmatch(ref) is not None)


def image_path(ref: Any, base_dir: str = "") -> str | None:
  """The file an entry of a row's ``images`` names (relative paths start at ``base_dir``), or
  None when the entry holds the image itself (base64, bytes, a PIL image)."""
  if isinstance(ref, dict) and ref.get("bytes") is None:
    ref = ref.get("path")
  if not isinstance(ref, str) or not ref or _is_base64(ref):
    return None
  return os.path.join(base_dir, ref) if base_dir and not os.path.isabs(ref) else ref


def read_image(ref: Any, where_: str, base_dir: str = "") -> Image:
  """The ``Image`` of one entry of a row's ``images``: a path (relative to ``base_dir``), a base64
  string or ``data:`` URL, a PIL image, or a ``{'bytes', 'path'}`` dict; a missing or corrupt
  image is a ``DataError`` naming ``where_``. A string is base64 only if it cannot be a path with
  an extension (base64 has no '.') and is long enough to hold an image."""
  if isinstance(ref, dict) and ref.get("bytes") is not None:
    return _decode(bytes(ref["bytes"]), f"image {ref.get('path') or '(bytes)'}", where_)
  path = image_path(ref, base_dir)
  if path is None and isinstance(ref, str) and ref:
    url = _DATA_URL.fullmatch(ref)
    try:
      raw = base64.b64decode(url[1] if url else ref, validate=False)
    except (binascii.Error, ValueError):
      raise DataError(f"{where_}: an image string is neither a file nor valid base64") from None
    return _decode(raw, "a base64 image", where_)
  if path is not None:
    if not os.path.isfile(path):
      raise DataError(f"{where_}: image file {path!r} does not exist")
    with open(path, "rb") as f:
      return _decode(f.read(), f"image file {path!r}", where_)
  if hasattr(ref, "convert") and hasattr(ref, "size"):  # a PIL image (datasets' Image feature)
    return Image.from_array(np.asarray(ref.convert("RGB")))
  raise DataError(f"{where_}: an image must be a path, a base64 string, a PIL image or a "
                  f"{{'bytes', 'path'}} dict, got {type(ref).__name__}")


def read_images(refs: Any, where_: str, base_dir: str = "") -> tuple:
  """A row's ``images`` field (a list; one entry alone is taken as a list of one)."""
  if refs is None:
    return ()
  if isinstance(refs, (str, dict)) or not isinstance(refs, Sequence):
    refs = [refs]
  return tuple(read_image(r, f"{where_} image {k}", base_dir) for k, r in enumerate(refs))


def marker_problem(prompt: str, images: Sequence[Image]) -> str | None:
  """Why a prompt's ``<image>`` markers do not place its images (one line), or None."""
  markers = prompt.count(IMAGE_MARKER) if isinstance(prompt, str) else 0
  if markers == len(images):
    return None
  return (f"the prompt has {markers} {IMAGE_MARKER} marker{'s' * (markers != 1)} and "
          f"{len(images)} image{'s' * (len(images) != 1)}: write one {IMAGE_MARKER} where each "
          "image goes")


# --- what a vision-language policy takes ------------------------------------------------------

def qwen2_vl_image_processor(**settings):
  """Hugging Face's Qwen2-VL image processor (Qwen2.5-VL uses it too) built directly, nothing
  downloaded: ``settings`` are its own (``patch_size=14``, ``temporal_patch_size=2``,
  ``merge_size=2``, ``min_pixels``, ``max_pixels``, ``image_mean``, ...). The PIL/NumPy one, so
  torch and torchvision are not needed."""
  try:
    from transformers import Qwen2VLImageProcessorPil as processor  # transformers >= 5
  except ImportError:
    from transformers import Qwen2VLImageProcessor as processor  # 4.x: the NumPy one
  return processor(**settings)


def load_image_processor(path: str):
  """The image processor saved in a local model directory (``preprocessor_config.json``)."""
  if not os.path.isfile(os.path.join(path, "preprocessor_config.json")):
    raise DataError(f"{path!r} has no preprocessor_config.json: a vision-language model "
                    "directory holds its image processor's settings there")
  from transformers import AutoImageProcessor  # slow import: only when images are processed
  return AutoImageProcessor.from_pretrained(path, local_files_only=True)


# Families whose processor Hugging Face builds as Qwen2-VL's, and the settings their released
# ``preprocessor_config.json`` writes beyond the tower's patch sizes (Qwen3-VL: mean, std 0.5).
_GRID_SETTINGS = {"qwen2_vl": {}, "qwen2_5_vl": {},
                  "qwen3_vl": dict(image_mean=[0.5] * 3, image_std=[0.5] * 3)}
# Gemma 3 writes each image as its soft tokens between these (Gemma3Processor's
# ``full_image_sequence``: a blank line either side).
GEMMA3 = Placeholders("<start_of_image>", "<image_soft_token>", "<end_of_image>")
GEMMA3_AROUND = "\n\n"


@dataclasses.dataclass(frozen=True)
class ImageFormat:
  """How a family's prompts take images: its Hugging Face image ``processor``, the
  ``placeholders`` an image stands as, and how many pad tokens each image has:
  ``tokens_per_image`` (Gemma 3's ``mm_tokens_per_image``, every image one size), or 0 for the
  grid's ``t*h*w / merge_size^2`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL); ``around``: text either side of
  each image's placeholder (Gemma 3's blank lines)."""
  processor: Any
  placeholders: Placeholders = QWEN2_VL
  tokens_per_image: int = 0
  around: str = ""


def gemma3_image_processor(image_size: int):
  """Hugging Face's Gemma 3 image processor (the PIL one) built directly: each image resized
  (bilinear) to ``image_size`` square, scaled to [0, 1], normalised with mean and std 0.5, no
  pan-and-scan: what Gemma 3's released ``preprocessor_config.json`` writes, at the tower's size."""
  try:
    from transformers import Gemma3ImageProcessorPil as processor  # transformers >= 5
  except ImportError:
    from transformers import Gemma3ImageProcessor as processor  # 4.x: the NumPy one
  return processor(size={"height": int(image_size), "width": int(image_size)},
                   do_pan_and_scan=False)


def image_format(model_cfg, tokenizer=None, path: str | None = None) -> ImageFormat:
  """The ``ImageFormat`` of a vision-language policy (``model_cfg``: its ``ModelConfig``): the
  image processor of its model directory (``preprocessor_config.json``) where ``path`` holds
  one, else Hugging Face's processor of the family built with the tower's sizes (Qwen2-VL's for
  the Qwen families, whose smallest image is one merged patch, ``min_pixels = (patch_size *
  merge_size)^2``, so a small image keeps its size: 28 x 84 is grid 1 x 2 x 6 at 14-pixel
  patches; Gemma 3's, resizing to ``image_size``). The placeholders are the tokenizer's own
  (``Tokenizer.image_placeholders``: ``'char_vl'`` writes every family's three image tokens with
  its three) or else the family's."""
  vision, family = dict(model_cfg.vision), model_cfg.model_type
  if family != "gemma3" and family not in _GRID_SETTINGS:
    raise ValueError(f"model_type={family!r}: rljax.data.images poses no images to it")
  processor = None
  if path and os.path.isfile(os.path.join(path, "preprocessor_config.json")):
    processor = load_image_processor(path)
  own = getattr(tokenizer, "image_placeholders", None)
  if family == "gemma3":
    processor = processor or gemma3_image_processor(vision["image_size"])
    if getattr(processor, "do_pan_and_scan", False):
      raise DataError(f"{path}/preprocessor_config.json: do_pan_and_scan=true; runs pose Gemma 3 "
                      "one image per marker (no pan-and-scan crops): set it false")
    return ImageFormat(processor, own or GEMMA3, int(vision["mm_tokens_per_image"]),
                       GEMMA3_AROUND)
  if processor is None:
    side = int(vision["patch_size"]) * int(vision["spatial_merge_size"])
    processor = qwen2_vl_image_processor(
        patch_size=int(vision["patch_size"]),
        temporal_patch_size=int(vision["temporal_patch_size"]),
        merge_size=int(vision["spatial_merge_size"]), min_pixels=side * side,
        **_GRID_SETTINGS[family])
  return ImageFormat(processor, own or QWEN2_VL)


def image_patches(processor, images: Sequence[Image]) -> tuple[np.ndarray, np.ndarray | None]:
  """``(pixel_values, image_grid_thw)`` of ``images`` by the family's ``processor``: a grid
  family's ``[sum N_patches, C*temporal_patch_size*patch_size^2]`` float32 patches and
  ``[num_images, 3]`` int32 grids, or Gemma 3's ``[num_images, C, H, H]`` images and None."""
  out = processor(images=[im.to_pil() for im in images], return_tensors="np")
  grid = out.get("image_grid_thw")
  return (np.asarray(out["pixel_values"], np.float32),
          None if grid is None else np.asarray(grid, np.int32).reshape(-1, 3))


def placeholder_count(grid_thw, merge_size: int) -> int:
  """Image tokens of one image: ``t * h * w / merge_size^2`` (the patch merger joins
  ``merge_size x merge_size`` neighbouring patches into one token)."""
  t, h, w = (int(x) for x in grid_thw)
  if h % merge_size or w % merge_size:
    raise ValueError(f"image grid {t}x{h}x{w} does not split into {merge_size}x{merge_size} "
                     "merged patches")
  return t * h * w // (merge_size * merge_size)


@dataclasses.dataclass(frozen=True)
class ImagePrompts:
  """A prompt batch with its images, as a vision-language policy takes it.

  ids: per prompt, its token ids with every image's placeholder expanded (``P`` lists).
  pixel_values: ``[sum N_patches, D]`` float32, the images' patches in prompt order (Gemma 3:
    ``[I, C, H, H]``, the images themselves).
  image_grid_thw: ``[I, 3]`` int32, each image's ``(t, h, w)`` in patches (Gemma 3: None).
  image_prompt: ``[I]`` int32, the prompt each image belongs to.
  """
  ids: list
  pixel_values: np.ndarray
  image_grid_thw: np.ndarray
  image_prompt: np.ndarray


def _placeholder_id(tokenizer, text: str) -> int:
  try:
    ids = tokenizer.encode(text)
  except TokenizerError:
    ids = []
  if len(ids) != 1:
    raise TokenizerError(f"the tokenizer has no {text!r} token, so a prompt's images cannot be "
                         "placed: prompts with images need a vision-language model's tokenizer "
                         "(this one is a text-only model's)")
  return ids[0]


def encode_image_prompts(tokenizer, problems, processor,
                         placeholders: Placeholders = QWEN2_VL) -> ImagePrompts:
  """``problems`` (with or without images) as a vision-language policy takes them
  (``ImagePrompts``): each ``<image>`` marker becomes the family's placeholder (``processor``: an
  ``ImageFormat``, or a Qwen2-VL-style image processor with ``placeholders``), its pad token
  repeated ``t*h*w / merge_size^2`` times by the image's grid, or ``tokens_per_image`` times
  (Gemma 3); the prompt is otherwise encoded as ``tokenizer.encode_prompt`` encodes it (chat
  template, BOS)."""
  fmt = processor if isinstance(processor, ImageFormat) else ImageFormat(processor, placeholders)
  placeholders, processor = fmt.placeholders, fmt.processor
  pad_id = _placeholder_id(tokenizer, placeholders.pad)
  for text in (placeholders.start, placeholders.end):
    _placeholder_id(tokenizer, text)
  marked = fmt.around + "".join(dataclasses.astuple(placeholders)) + fmt.around
  ids, patches, grids, owners = [], [], [], []
  for row, problem in enumerate(problems):
    images = tuple(problem.images)
    wrong = marker_problem(problem.prompt, images)
    if wrong:
      raise DataError(f"{where(problem)}: {wrong}")
    if any(p in problem.prompt for p in dataclasses.astuple(placeholders)):
      raise DataError(f"{where(problem)}: the prompt writes an image placeholder token itself; "
                      f"mark where an image goes with {IMAGE_MARKER}")
    prompt_ids = tokenizer.encode_prompt(problem.prompt.replace(IMAGE_MARKER, marked))
    counts = []
    if images:
      values, grid = image_patches(processor, images)
      patches.append(values)
      owners += [row] * len(images)
      if fmt.tokens_per_image:
        counts = [fmt.tokens_per_image] * len(images)
      else:
        grids.append(grid)
        counts = [placeholder_count(g, int(processor.merge_size)) for g in grid]
    expanded, k = [], 0
    for i in prompt_ids:
      if i == pad_id:
        expanded += [pad_id] * counts[k]
        k += 1
      else:
        expanded.append(i)
    ids.append(expanded)
  if fmt.tokens_per_image:
    size = processor.size
    empty = np.zeros((0, 3, int(size["height"]), int(size["width"])), np.float32)
    grid_thw = None
  else:
    width = int(processor.temporal_patch_size) * int(processor.patch_size) ** 2 * 3
    empty = np.zeros((0, width), np.float32)
    grid_thw = np.concatenate(grids) if grids else np.zeros((0, 3), np.int32)
  return ImagePrompts(
      ids=ids, pixel_values=np.concatenate(patches) if patches else empty,
      image_grid_thw=grid_thw, image_prompt=np.asarray(owners, np.int32))

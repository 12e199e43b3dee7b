"""``rljax plan``'s part for a vision-language policy (``rljax.vision``): the image tower's
parameters and memory, and the image tokens of a prompt. Nothing is allocated.

- **Image tokens.** An image the processor leaves ``H x W`` pixels is a grid of
  ``(1, H/p, W/p)`` patches (``p`` = ``patch_size``; a still image is one temporal patch, its
  frame repeated ``temporal_patch_size`` times) and ``H W / (p m)^2`` tokens (``m`` =
  ``spatial_merge_size``: the merger joins ``m x m`` patches). ``H`` and ``W`` are rounded to
  multiples of ``p m`` as the Qwen2-VL processor's ``smart_resize`` does (its pixel bounds
  aside). The size is ``plan.image_size`` (``(H, W)``, with ``plan.images_per_prompt``, default
  1), else the embedded task's (``data.source='embedded:NAME'`` of a task of images: its level's
  ``height x width``, one image a problem); without either the image tokens are not counted.
- **Parameters.** The tower's (``visual``: blocks and patch merger), counted from the abstract
  parameter tree and placed by the partition rules like the rest; they are part of ``params``.
  With ``model.vision.trainable=False`` (or LoRA: the tower is in the frozen base) they have no
  optimizer state and no gradient (``rljax.learner.state.trainable``, which the plan's optimizer
  state and gradients already follow).
- **Activations.** A row's ``N`` patches (the prompt's, padded to a multiple of 16 as
  ``multimodal.row_images`` pads them) go through ``depth`` blocks of width ``D_v``, heads
  ``H_v``, MLP ``F_v``, with dense attention over the row's patches (``[H_v, N, N]`` float32
  scores: the materialised backend's figures, ``forward_bytes``). The learner runs the tower
  once per completion: a trained tower keeps all ``depth`` blocks of every row of a micro-batch
  for the backward (the tower is not rematerialised); a frozen one is a forward, one block live.
  The sampler runs it once per prompt at the prefill, one block live.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from rljax.data import make_task
from rljax.models import lora
from rljax.models.config import ModelConfig

PATCH_BUCKET = 16  # multimodal.row_images pads a row's patches to a multiple of this


@dataclasses.dataclass
class TowerPlan:
  """The tower's figures: ``params`` (count), per-device ``bytes`` by part (``tower_params``,
  within the plan's params; ``tower_train`` and ``tower_rollout``: activations added to those
  phases), the image shapes and the report's assumptions and warnings."""
  params: int
  trainable: bool
  bytes: dict
  shapes: dict
  assumptions: list
  warnings: list


def image_grid(height: int, width: int, vision: dict) -> tuple[int, int, int]:
  """``(t, h, w)`` patches of an ``height x width`` image: each side rounded to a multiple of
  ``patch_size x spatial_merge_size`` (at least one), one temporal patch."""
  p, m = int(vision["patch_size"]), int(vision["spatial_merge_size"])
  side = lambda n: max(m, int(round(n / (p * m))) * m)
  return 1, side(height), side(width)


def image_tokens(grid, vision: dict) -> int:
  """Tokens of one image of ``grid`` patches: ``t h w / m^2``."""
  t, h, w = grid
  return t * h * w // int(vision["spatial_merge_size"]) ** 2


def planned_images(config) -> tuple[int, int, int, str] | None:
  """``(height, width, images per prompt, where from)`` of the run's images, or None."""
  plan = config.get("plan") or {}
  size = plan.get("image_size")
  if size is not None:
    height, width = (int(x) for x in size)
    return height, width, int(plan.get("images_per_prompt") or 1), "plan.image_size"
  source = config.data.source
  if not source.startswith("embedded:"):
    return None
  task = make_task(source.split(":", 1)[1], config.data.difficulty)
  level = getattr(task, "level", None)
  if not getattr(task, "images", False) or not hasattr(level, "height"):
    return None
  return level.height, level.width, 1, f"the {task.name} task's level {task.difficulty}"


def plan_tower(config, cfg: ModelConfig, shapes: dict, param_bytes: Callable[[dict], int], *,
               prompt_len: int, prompts_dev: int, train_rows: int,
               forward_bytes: Callable[[ModelConfig, int, int, int, int, int], int]
               ) -> TowerPlan | None:
  """The tower's ``TowerPlan`` (None for a text-only policy). ``shapes``: the policy's parameter
  shapes; ``param_bytes(subtree name)``: a subtree's per-device bytes; ``train_rows``: rows of
  one micro-batch live at once on a device; ``forward_bytes(d, heads, head_dim, f, tokens,
  width)``: one block's live activations of a forward over ``tokens`` tokens of rows ``width``
  wide with materialised attention."""
  if cfg.vision is None:
    return None
  v = dict(cfg.vision)
  params = lora.count(shapes[lora.TOWER])
  trainable = cfg.vision_trainable and not cfg.lora_rank
  assumptions, warnings = [], []
  shape = dict(image_tokens_per_prompt=None, patches_per_prompt=None)
  train = rollout = 0
  images = planned_images(config)
  if images is None:
    warnings.append("image tokens and the tower's activations not counted: the data's image "
                    "size is unknown (set plan.image_size=(H, W) and plan.images_per_prompt)")
  else:
    height, width, count, origin = images
    grid = image_grid(height, width, v)
    tokens = count * image_tokens(grid, v)
    patches = count * grid[0] * grid[1] * grid[2]
    padded = -(-patches // PATCH_BUCKET) * PATCH_BUCKET
    shape.update(image_size=(height, width), images_per_prompt=count, image_grid=grid,
                 image_tokens_per_prompt=tokens, patches_per_prompt=padded)
    assumptions.append(f"{count} image(s) of {height}x{width} pixels a prompt ({origin}): grid "
                       f"{'x'.join(map(str, grid))} patches, {tokens} image tokens, {padded} "
                       f"patches a row (padded to {PATCH_BUCKET}s)")
    if tokens > prompt_len:
      warnings.append(f"a prompt's {tokens} image tokens exceed the planned prompt length of "
                      f"{prompt_len} tokens: set plan.prompt_len (or data.prompt_bucket) to hold "
                      "them")
    heads = int(v["num_heads"])
    block = forward_bytes(int(v["hidden_size"]), heads, int(v["hidden_size"]) // heads,
                          int(v["intermediate_size"]), padded, padded)
    depth = int(v["depth"])
    train = train_rows * (depth if trainable else 1) * block
    rollout = prompts_dev * block
  return TowerPlan(params=params, trainable=trainable,
                   bytes=dict(tower_params=param_bytes(lora.TOWER), tower_train=train,
                              tower_rollout=rollout),
                   shapes=shape, assumptions=assumptions, warnings=warnings)

"""``rljax plan`` of a Qwen2.5-VL policy: the tower's parameters (against ``transformers``' count
and a hand count), its bytes and optimizer state, the image tokens of a prompt (against the
Hugging Face image processor's grid) and the tower's activations (hand count)."""
import os

import ml_collections
import numpy as np
import pytest

from rljax import plan as plan_lib
from rljax import plan_vision
from rljax.config import loader as config_loader

transformers = pytest.importorskip("transformers")

GRPO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "algos", "grpo.py")
# The tiny tower of tests/vision/test_qwen2_5_vl.py: depth 2, D 32, F 48, 2 heads, 4-pixel
# patches of 2 frames x 3 channels, 2x2 merge into the text width 64.
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, window_size=16, out_hidden_size=64,
              fullatt_block_indexes=[1], in_channels=3)
# Hand count: patch embedding 32 x (3 x 2 x 4 x 4); per block two norms (2 x 32), qkv
# (32 x 96 + 96), proj (32 x 32 + 32), gate and up (2 x (32 x 48 + 48)), down (48 x 32 + 32);
# the merger's norm (32), mlp_0 (128 x 128 + 128) and mlp_2 (128 x 64 + 64).
TOWER = 32 * 96 + 2 * (64 + 3168 + 1056 + 2 * 1584 + 1568) + 32 + 16512 + 8256
assert TOWER == 45920


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
  """(a directory holding only the config.json of the tiny Qwen2.5-VL, its tower's parameter
  count by transformers)."""
  config = transformers.Qwen2_5_VLConfig(
      text_config=dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                            mrope_section=[2, 3, 3])),
      vision_config=VISION, image_token_id=120, video_token_id=121, vision_start_token_id=118,
      vision_end_token_id=119, tie_word_embeddings=False)
  path = str(tmp_path_factory.mktemp("vl_config"))
  config.save_pretrained(path)
  model = transformers.Qwen2_5_VLForConditionalGeneration(config)
  return path, sum(p.numel() for p in model.model.visual.parameters())


def _plan(path, **overrides):
  config = config_loader.load_config(GRPO, list({
      "model.source": f"hf:{path}", "data.prompt_bucket": "16", "rollout.prompts_per_step": "4",
      "rollout.group_size": "2", "model.pack": "auto", **overrides}.items()))
  with config.unlocked():
    config.plan = ml_collections.ConfigDict(dict(image_size=(56, 100), images_per_prompt=2))
  return plan_lib.plan(config, "cpu")


def test_tower_parameters_and_image_tokens(vl_dir):
  path, theirs = vl_dir
  assert theirs == TOWER
  p = _plan(path)
  assert p["model"]["tower_params"] == TOWER and p["model"]["tower_trainable"]
  assert p["bytes"]["tower_params"] == 4 * TOWER  # float32 on one device
  # 56 x 100 pixels, sides rounded to multiples of patch x merge = 8 pixels as the processor
  # rounds them (100 / 8 = 12.5 -> 12: 96): grid 1 x 14 x 24 patches of 4 pixels.
  proc = transformers.Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                               min_pixels=64, max_pixels=10 ** 6)
  image = np.zeros((56, 100, 3), np.uint8)
  grid = tuple(int(x) for x in proc(images=[image], return_tensors="np")["image_grid_thw"][0])
  assert plan_vision.image_grid(56, 100, dict(patch_size=4, spatial_merge_size=2)) == grid
  assert grid == (1, 14, 24)
  s = p["shapes"]
  assert s["image_tokens_per_prompt"] == 2 * 14 * 24 // 4  # two images, 84 tokens each
  assert s["patches_per_prompt"] == 2 * 14 * 24  # 672, already a multiple of 16
  assert any("image tokens exceed the planned prompt length of 16" in w for w in p["warnings"])
  # the tower's activations: per patch and block (D 32, 2 heads of 16, F 48, float32) the
  # decoder's figures, (10 x 32 + 2 x 3 x 32 + 4 x 48) x 4 bytes, and dense attention over the
  # row's 672 patches, 2 heads x 672 x (8 + 4) bytes
  n = 672
  block = n * ((10 * 32 + 2 * 96 + 4 * 48) * 4 + 2 * n * (8 + 4))
  assert p["bytes"]["tower_rollout"] == s["prompts_per_device"] * block  # one block, per prompt
  rows = p["bytes"]["tower_train"] // (2 * block)  # every block of every row of a micro-batch
  assert rows * 2 * block == p["bytes"]["tower_train"] and rows >= 1
  # a vision policy's update is never packed under model.pack='auto'
  assert not any("the update packed" in a for a in p["assumptions"])


def test_frozen_tower_has_no_optimizer_state_nor_gradient(vl_dir):
  path, _ = vl_dir
  trained, frozen = _plan(path), _plan(path, **{"model.vision.trainable": "False"})
  assert not frozen["model"]["tower_trainable"]
  by, fz = trained["bytes"], frozen["bytes"]
  assert by["params"] == fz["params"]
  assert by["opt_state"] - fz["opt_state"] == 2 * 4 * TOWER  # AdamW's mu and nu
  # one gradient copy, or two with micro-batches (accumulator and the current one)
  assert by["gradients"] - fz["gradients"] in (4 * TOWER, 2 * 4 * TOWER)
  # a frozen tower is a forward in the update: one block live instead of all (depth 2)
  assert by["tower_train"] == 2 * fz["tower_train"]
  assert "frozen" in plan_lib.format_plan(frozen) and "vision tower" in \
      plan_lib.format_plan(frozen)

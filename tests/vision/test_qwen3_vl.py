"""Qwen3-VL against ``transformers``: a tiny random model built here (3 vision blocks, two of
them feeding DeepStack, a learned 4x4 position grid resampled to each image's grid, patches of 4
pixels; a 3-layer text model with interleaved M-RoPE), the Hugging Face image processor for
pixels and grid sizes, logits with two images amid text in one row, one in another, a text-only
row, left padding; greedy tokens against ``generate``; sampled log-probs against the learner's
forward; the export round trip."""
import functools

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rljax.models import hf  # noqa: E402
from rljax.vision import multimodal, qwen3_vl  # noqa: E402
from tests.vision import hf_tiny  # noqa: E402

VOCAB, IMAGE, START, END = 128, 120, 118, 119


def _hf_config():
  return transformers.Qwen3VLConfig(
      text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       max_position_embeddings=512,
                       rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                            mrope_section=[3, 3, 2], mrope_interleaved=True),
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
      vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=4,
                         spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                         num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
      image_token_id=IMAGE, video_token_id=121, vision_start_token_id=START,
      vision_end_token_id=END, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(path, transformers model, rljax cfg, params)."""
  path = str(tmp_path_factory.mktemp("qwen3_vl"))
  torch.manual_seed(0)
  model = transformers.Qwen3VLForConditionalGeneration(_hf_config()).float().eval()
  return hf_tiny.save_tiny(model, path)


@pytest.fixture(scope="module")
def images():
  """Three images of different sizes (grids 4x4, 6x4, 4x10 patches) through the HF processor."""
  return hf_tiny.qwen_images()


def _batch(grid):
  rng = np.random.default_rng(1)
  text = lambda n: list(rng.integers(3, 110, n))
  image = lambda g: [START] + [IMAGE] * (int(np.prod(g)) // 4) + [END]
  rows = [text(3) + image(grid[0]) + text(4) + image(grid[1]) + text(2),
          text(5) + image(grid[2]) + text(3), text(9)]
  width = max(map(len, rows))
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, 1
  return tokens, mask


def test_config(tiny):
  _, _, cfg, _ = tiny
  assert cfg.mrope_section == (3, 3, 2) and cfg.mrope_interleaved and not cfg.qkv_bias
  assert qwen3_vl.vision_config(cfg)["deepstack_visual_indexes"] == (0, 1)


def test_tower_matches_transformers(tiny, images):
  """The merged features and the DeepStack features."""
  _, model, cfg, params = tiny
  pixels, grid = images
  lay = qwen3_vl.layout(grid, qwen3_vl.vision_config(cfg))
  ours, deep = jax.jit(lambda p, x, l: multimodal.image_features(cfg, p, x, l))(params, pixels,
                                                                               lay)
  with torch.no_grad():
    out = model.model.visual(torch.tensor(pixels), grid_thw=torch.tensor(grid))
  np.testing.assert_allclose(np.asarray(ours), out.pooler_output.numpy(), atol=1e-5, rtol=0)
  for k, theirs in enumerate(out.deepstack_features):
    np.testing.assert_allclose(np.asarray(deep[k]), theirs.numpy(), atol=1e-5, rtol=0)


def test_logits_match_transformers(tiny, images):
  _, model, cfg, params = tiny
  pixels, grid = images
  tokens, mask = _batch(grid)
  rows = multimodal.row_images(cfg, tokens, mask, pixels, grid)
  ours = jax.jit(functools.partial(multimodal.logits, cfg))(params, tokens, mask, rows)
  ids = torch.tensor(tokens, dtype=torch.long)
  with torch.no_grad():
    out = model(input_ids=ids, attention_mask=torch.tensor(mask), pixel_values=torch.tensor(pixels),
                image_grid_thw=torch.tensor(grid), mm_token_type_ids=(ids == IMAGE).int())
    hf_pos, _ = model.model.get_rope_index(ids, image_grid_thw=torch.tensor(grid),
                                           attention_mask=torch.tensor(mask),
                                           mm_token_type_ids=(ids == IMAGE).int())
  np.testing.assert_array_equal(np.moveaxis(rows.positions, 1, 0), hf_pos.numpy())
  diff = np.abs(np.asarray(ours) - out.logits.numpy())[mask.astype(bool)]
  print("max |logits - transformers|", diff.max())
  assert diff.max() <= 1e-4, diff.max()


def test_export_round_trip(tiny, tmp_path):
  path, model, cfg, params = tiny
  out = str(tmp_path / "export")
  hf_tiny.assert_export_round_trip(path, cfg, params, out)
  again = transformers.Qwen3VLForConditionalGeneration.from_pretrained(out).eval()
  for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
    assert torch.equal(a, b), name


T = 5


def test_greedy_equals_transformers_generate(tiny, images):
  from rljax.rollout import SamplingParams, sample
  _, model, cfg, params = tiny
  pixels, grid = images
  tokens, mask = _batch(grid)
  sp = SamplingParams(greedy=True, max_new_tokens=T, stop_ids=(), pad_id=0)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(0), sp,
                            images=multimodal.row_images(cfg, tokens, mask, pixels, grid)))
  ids = torch.tensor(tokens, dtype=torch.long)
  with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.tensor(mask),
                         pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grid),
                         mm_token_type_ids=(ids == IMAGE).int(), max_new_tokens=T,
                         min_new_tokens=T, do_sample=False, pad_token_id=0)
  np.testing.assert_array_equal(r.tokens, out[:, tokens.shape[1]:].numpy())


def test_sampler_logp_matches_teacher_forcing(tiny, images):
  from rljax.learner import step
  from rljax.rollout import SamplingParams, sample
  _, _, cfg, params = tiny
  pixels, grid = images
  tokens, mask = _batch(grid)
  sp = SamplingParams(temperature=1.0, max_new_tokens=T, stop_ids=(), pad_id=0)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(1), sp, group_size=2,
                            images=multimodal.row_images(cfg, tokens, mask, pixels, grid)))
  logp, _, _ = jax.jit(lambda p: step.policy_stats(cfg, p, r, 8, step.update_lib.RowSplit(
      parts=1)))(params)
  assert np.abs(np.asarray(logp) - r.sampler_logp)[r.mask == 1].max() <= 1e-5


def test_tiny_model_is_a_transformers_model(tmp_path):
  """model.source='tiny' with model.family='qwen3_vl': exported and run by transformers with
  the same logits (one 32x32 image: 2x2 patches of 16 pixels, one image token)."""
  import os
  from rljax import models
  from rljax.config import loader
  from rljax.models import transformer
  from tests.train import tiny as tiny_run
  config = loader.load_config(os.path.join(tiny_run.ROOT, "configs", "base.py"),
                              [(k, v) for k, v in tiny_run.OVERRIDES.items()
                               if k.startswith("model.")] + [("model.family", "qwen3_vl")])
  cfg = models.tiny_config(config.model, 60, eos_token_id=1, pad_token_id=0)
  params = transformer.init_params(cfg, seed=0)
  hf.save_hf(str(tmp_path), cfg, params)
  model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  proc = transformers.Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, min_pixels=32 * 32)
  pic = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
  out = proc(images=[pic], return_tensors="np")
  pixels, grid = out["pixel_values"].astype(np.float32), out["image_grid_thw"]
  tokens = np.array([[5, 57, 58, 59, 6, 7]], np.int32)
  mask = np.ones_like(tokens)
  ours = jax.jit(functools.partial(multimodal.logits, cfg))(
      params, tokens, mask, multimodal.row_images(cfg, tokens, mask, pixels, grid))
  with torch.no_grad():
    ids = torch.tensor(tokens, dtype=torch.long)
    theirs = model(input_ids=ids, attention_mask=torch.tensor(mask),
                   pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grid),
                   mm_token_type_ids=(ids == 58).int()).logits.numpy()
  assert np.abs(np.asarray(ours) - theirs).max() <= 1e-4

"""Gemma 3 with images against ``transformers``: a tiny random Gemma3ForConditionalGeneration
built here (a 2-layer SigLIP tower over 16x16 images of 4-pixel patches, pooled to 4 soft tokens;
a 2-layer text model, one sliding layer whose window of 3 cuts through an image's 4 tokens, one
global), the Hugging Face image processor for pixels, logits with two images amid text in one
row, one in another, a text-only row, left padding; greedy tokens against ``generate`` (the
sampler and the engine); the sampler's log-probs against the learner's forward; the export
round trip."""
import functools

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rljax.models import hf  # noqa: E402
from rljax.vision import gemma3_vl, multimodal  # noqa: E402
from tests.vision import hf_tiny  # noqa: E402

VOCAB, IMAGE, BOI, EOI = 128, 120, 118, 119
PER_IMAGE = 4


def _hf_config():
  return transformers.Gemma3Config(
      text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       query_pre_attn_scalar=16, sliding_window=3,
                       layer_types=["sliding_attention", "full_attention"],
                       max_position_embeddings=512, bos_token_id=2, eos_token_id=1,
                       pad_token_id=0),
      vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=2, image_size=16, patch_size=4,
                         vision_use_head=False),
      mm_tokens_per_image=PER_IMAGE, image_token_index=IMAGE, boi_token_index=BOI,
      eoi_token_index=EOI)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(path, transformers model, rljax cfg, params)."""
  path = str(tmp_path_factory.mktemp("gemma3_vl"))
  torch.manual_seed(0)
  model = transformers.Gemma3ForConditionalGeneration(_hf_config()).float().eval()
  zeroed = lambda name, p: p.normal_(0, 0.05) if "mm_input_projection" in name else None
  return hf_tiny.save_tiny(model, path, init=zeroed)  # transformers initialises it to zeros


@pytest.fixture(scope="module")
def images():
  """Three images of different sizes and shapes through the HF processor (resized to 16x16):
  pixel_values [3, 3, 16, 16]."""
  proc = transformers.Gemma3ImageProcessorPil(size={"height": 16, "width": 16})
  rng = np.random.default_rng(0)
  pics = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((16, 16), (24, 16),
                                                                       (16, 40))]
  return proc(images=pics, return_tensors="np")["pixel_values"].astype(np.float32)


def _image():
  return [BOI] + [IMAGE] * PER_IMAGE + [EOI]


def _batch():
  """Left-padded rows: two images amid text; one image; text only."""
  rng = np.random.default_rng(1)
  text = lambda n: list(rng.integers(3, 110, n))
  rows = [text(3) + _image() + text(4) + _image() + text(2), text(5) + _image() + text(3),
          text(9)]
  width = max(map(len, rows))
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, 1
  return tokens, mask


def test_config(tiny):
  _, _, cfg, _ = tiny
  vision = gemma3_vl.vision_config(cfg)
  assert cfg.model_type == "gemma3" and cfg.layer_types == ("sliding_attention",
                                                            "full_attention")
  assert (vision["image_token_id"], vision["boi_token_id"], vision["mm_tokens_per_image"]) == (
      IMAGE, BOI, PER_IMAGE)
  assert gemma3_vl.grid_sizes(vision) == (4, 2, 2)


def test_tower_matches_transformers(tiny, images):
  _, model, cfg, params = tiny
  from rljax.models import transformer
  ours = jax.jit(lambda p, x: transformer.bind(cfg, p).visual(x))(params, images)
  with torch.no_grad():
    theirs = model.model.get_image_features(torch.tensor(images)).pooler_output
  np.testing.assert_allclose(np.asarray(ours), theirs.reshape(-1, 64).numpy(), atol=1e-5,
                             rtol=0)


def _hf_logits(model, tokens, mask, pixels):
  ids = torch.tensor(tokens, dtype=torch.long)
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    return model(input_ids=ids, attention_mask=torch.tensor(mask),
                 pixel_values=torch.tensor(pixels), token_type_ids=(ids == IMAGE).long(),
                 position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()


def test_logits_match_transformers(tiny, images):
  """Two images amid text, one, none; left padding; the sliding window cuts through images."""
  _, model, cfg, params = tiny
  tokens, mask = _batch()
  rows = multimodal.row_images(cfg, tokens, mask, images)
  assert rows.pixels.shape == (3, 2, 3, 16, 16) and rows.positions.shape == (3, 1, 21)
  ours = jax.jit(functools.partial(multimodal.logits, cfg))(params, tokens, mask, rows)
  theirs = _hf_logits(model, tokens, mask, images)
  diff = np.abs(np.asarray(ours) - theirs)[mask.astype(bool)]
  assert diff.max() <= 1e-4, diff.max()
  print("max |logits - transformers|", diff.max())
  blocks = np.asarray(multimodal.image_blocks(tokens, mask, IMAGE))
  assert blocks.max(axis=1).tolist() == [2, 1, 0]


def test_image_blocks_matter(tiny, images, monkeypatch):
  """A causal-only forward over the same embeddings differs at the images: the test above
  exercises the bidirectional blocks."""
  _, _, cfg, params = tiny
  tokens, mask = _batch()
  rows = multimodal.row_images(cfg, tokens, mask, images)
  ours = jax.jit(functools.partial(multimodal.logits, cfg))(params, tokens, mask, rows)
  monkeypatch.setattr(multimodal, "prefill_attend", lambda *a: None)
  causal = jax.jit(functools.partial(multimodal.logits, cfg))(params, tokens, mask, rows)
  diff = np.abs(np.asarray(ours) - np.asarray(causal)).max(axis=-1)
  assert diff[0][tokens[0] == IMAGE].max() > 1e-3  # the text-only row: the same attention
  assert diff[2][mask[2] == 1].max() <= 1e-5


def test_placeholder_mismatch_is_one_error(tiny, images):
  _, _, cfg, _ = tiny
  tokens = np.array([[5, BOI] + [IMAGE] * 3 + [EOI]], np.int32)
  with pytest.raises(ValueError, match="row 0 has 3 image placeholders; each image takes"):
    multimodal.row_images(cfg, tokens, np.ones_like(tokens), images[:1])
  tokens = np.array([[5] + _image()], np.int32)
  with pytest.raises(ValueError, match="2 images but placeholders for 1"):
    multimodal.row_images(cfg, tokens, np.ones_like(tokens), images[:2])
  with pytest.raises(ValueError, match="pass no image_grid_thw"):
    multimodal.row_images(cfg, tokens, np.ones_like(tokens), images[:1], np.ones((1, 3)))


def test_export_round_trip(tiny, tmp_path):
  """load -> save: every tensor bit-identical under transformers' names, and transformers
  loads the export as the same model."""
  path, model, cfg, params = tiny
  out = str(tmp_path / "export")
  hf_tiny.assert_export_round_trip(path, cfg, params, out)
  again = transformers.Gemma3ForConditionalGeneration.from_pretrained(out).eval()
  assert again.config.text_config.sliding_window == 3 and again.config.mm_tokens_per_image == 4
  for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
    assert torch.equal(a, b), name


# --- the sampler ----------------------------------------------------------------------------------

T = 5


def test_greedy_equals_transformers_generate(tiny, images):
  """The sampler and the engine a run samples through: greedy tokens equal ``generate``."""
  from rljax.rollout import SamplingParams, sample
  from rljax.rollout.engines import JaxEngine
  _, model, cfg, params = tiny
  tokens, mask = _batch()
  sp = SamplingParams(greedy=True, max_new_tokens=T, stop_ids=(), pad_id=0)
  rows = multimodal.row_images(cfg, tokens, mask, images)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(0), sp, images=rows))
  ids = torch.tensor(tokens, dtype=torch.long)
  with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.tensor(mask),
                         pixel_values=torch.tensor(images), token_type_ids=(ids == IMAGE).long(),
                         max_new_tokens=T, min_new_tokens=T, do_sample=False, pad_token_id=0)
  np.testing.assert_array_equal(r.tokens, out[:, tokens.shape[1]:].numpy())
  engine = JaxEngine(cfg)
  engine.load_weights(engine.transfer(params)[0], 0)
  got = engine.generate(tokens, mask, jax.random.key(0), sp, 1, images=rows)
  np.testing.assert_array_equal(got.tokens, r.tokens)
  assert got.extras["images"].pixels.shape == (3, 2, 3, 16, 16)


def test_sampler_logp_matches_teacher_forcing(tiny, images):
  """Groups of 2 sampled: each completion's sampler log-probs equal the learner's scoring
  forward, which runs the tower again and attends within the images both ways as the prefill
  did."""
  from rljax.learner import step
  from rljax.rollout import SamplingParams, sample
  _, _, cfg, params = tiny
  tokens, mask = _batch()
  sp = SamplingParams(temperature=1.0, max_new_tokens=T, stop_ids=(), pad_id=0)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(1), sp, group_size=2,
                            images=multimodal.row_images(cfg, tokens, mask, images)))
  assert r.extras["images"].pixels.shape[0] == 6
  logp, _, _ = jax.jit(lambda p: step.policy_stats(cfg, p, r, 8, step.update_lib.RowSplit(
      parts=1)))(params)
  assert np.abs(np.asarray(logp) - r.sampler_logp)[r.mask == 1].max() <= 1e-5


def test_tiny_model_is_a_transformers_model(tmp_path):
  """model.source='tiny' with model.family='gemma3': a SigLIP tower for 28x28 images of the
  processor's 14-pixel patches, the image tokens as the last three ids ('char_vl''s order),
  exported and run by transformers with the same logits."""
  import os
  from rljax import models
  from rljax.config import loader
  from rljax.models import transformer
  from tests.train import tiny as tiny_run
  config = loader.load_config(os.path.join(tiny_run.ROOT, "configs", "base.py"),
                              [(k, v) for k, v in tiny_run.OVERRIDES.items()
                               if k.startswith("model.")] + [("model.family", "gemma3")])
  cfg = models.tiny_config(config.model, 60, eos_token_id=1, pad_token_id=0)
  vision = gemma3_vl.vision_config(cfg)
  assert (vision["boi_token_id"], vision["image_token_id"], vision["eoi_token_id"]) == (57, 58, 59)
  params = transformer.init_params(cfg, seed=0)
  hf.save_hf(str(tmp_path), cfg, params)
  model = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  proc = transformers.Gemma3ImageProcessorPil(size={"height": 28, "width": 28})
  pic = np.random.default_rng(3).integers(0, 256, (28, 56, 3), dtype=np.uint8)
  pixels = proc(images=[pic], return_tensors="np")["pixel_values"].astype(np.float32)
  tokens = np.array([[5, 57, 58, 59, 6, 7]], np.int32)
  mask = np.ones_like(tokens)
  ours = jax.jit(functools.partial(multimodal.logits, cfg))(
      params, tokens, mask, multimodal.row_images(cfg, tokens, mask, pixels))
  ids = torch.tensor(tokens, dtype=torch.long)
  with torch.no_grad():
    theirs = model(input_ids=ids, attention_mask=torch.tensor(mask),
                   pixel_values=torch.tensor(pixels),
                   token_type_ids=(ids == 58).long()).logits.numpy()
  assert np.abs(np.asarray(ours) - theirs).max() <= 1e-4

"""Qwen2.5-VL against ``transformers``: a tiny random model built here (2 vision blocks, one of
them windowed, patches of 4 pixels; a 2-layer text model), the Hugging Face image processor for
pixels and grid sizes, logits with several images per row, images in the middle of the text,
rows with and without images; the export round trip."""
import functools
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rljax.models import hf  # noqa: E402
from rljax.models.config import ModelConfig  # noqa: E402
from rljax.vision import multimodal, qwen2_5_vl  # noqa: E402
from tests.vision import hf_tiny  # noqa: E402

VOCAB, IMAGE, START, END = 128, 120, 118, 119


def _hf_config():
  return transformers.Qwen2_5_VLConfig(
      text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                            mrope_section=[2, 3, 3]),
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
      vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=4,
                         spatial_merge_size=2, temporal_patch_size=2, window_size=16,
                         out_hidden_size=64, fullatt_block_indexes=[1], in_channels=3),
      image_token_id=IMAGE, video_token_id=121, vision_start_token_id=START,
      vision_end_token_id=END, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(path, transformers model, rljax cfg, params)."""
  path = str(tmp_path_factory.mktemp("qwen2_5_vl"))
  torch.manual_seed(0)
  model = transformers.Qwen2_5_VLForConditionalGeneration(_hf_config()).float().eval()
  return hf_tiny.save_tiny(model, path, also=lambda name: "ln_q" in name)


@pytest.fixture(scope="module")
def images():
  """Three images of different sizes through the HF processor: (pixels [N, 96], grid [3, 3])."""
  return hf_tiny.qwen_images()


def _placeholders(grid):
  return [START] + [IMAGE] * (int(np.prod(grid)) // 4) + [END]


def _batch(grid):
  """Left-padded rows: two images amid text; one image; text only."""
  rng = np.random.default_rng(1)
  text = lambda n: list(rng.integers(3, 110, n))
  rows = [text(3) + _placeholders(grid[0]) + text(4) + _placeholders(grid[1]) + text(2),
          text(5) + _placeholders(grid[2]) + text(3),
          text(9)]
  width = max(map(len, rows))
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, 1
  return tokens, mask


def test_config_and_layout(tiny, images):
  _, model, cfg, _ = tiny
  assert cfg.mrope_section == (2, 3, 3) and cfg.qkv_bias and not cfg.o_bias
  vision = qwen2_5_vl.vision_config(cfg)
  _, grid = images
  lay = qwen2_5_vl.layout(grid, vision)
  from transformers import vision_utils as vu
  g = torch.tensor(grid)
  window_index, cu_windows = vu.get_vision_window_index(g, 2, 16, 4)
  np.testing.assert_array_equal(lay.order.reshape(-1, 4)[:, 0] // 4, window_index.numpy())
  bounds = np.flatnonzero(np.diff(lay.windows)) + 1
  np.testing.assert_array_equal(np.r_[0, bounds, len(lay.windows)], cu_windows.numpy())
  positions = vu.get_vision_position_ids(g, 2).numpy()
  np.testing.assert_array_equal(lay.positions, positions[lay.order])


def test_tower_matches_transformers(tiny, images):
  _, model, cfg, params = tiny
  pixels, grid = images
  lay = qwen2_5_vl.layout(grid, qwen2_5_vl.vision_config(cfg))
  ours = jax.jit(lambda p, x, l: multimodal.image_features(cfg, p, x, l))(params, pixels, lay)
  with torch.no_grad():
    theirs = model.model.visual(torch.tensor(pixels), grid_thw=torch.tensor(grid)).pooler_output
  np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=1e-5, rtol=0)


def test_logits_match_transformers(tiny, images):
  """Several images per row, images amid text, left padding, a text-only row."""
  _, model, cfg, params = tiny
  pixels, grid = images
  tokens, mask = _batch(grid)
  vision = qwen2_5_vl.vision_config(cfg)
  positions, deltas = multimodal.rope_index(tokens, mask, grid, vision)
  rows = multimodal.row_images(cfg, tokens, mask, pixels, grid)
  assert rows.pixels.shape[:2] == (3, 48)  # row 0's 16 + 24 patches, padded to 16s
  np.testing.assert_array_equal(rows.positions, np.moveaxis(positions, 0, 1))
  ours = jax.jit(functools.partial(multimodal.logits, cfg))(params, tokens, mask, rows)
  with torch.no_grad():
    ids = torch.tensor(tokens, dtype=torch.long)
    out = model(input_ids=ids, attention_mask=torch.tensor(mask), pixel_values=torch.tensor(pixels),
                image_grid_thw=torch.tensor(grid), mm_token_type_ids=(ids == IMAGE).int())
    hf_pos, hf_deltas = model.model.get_rope_index(
        ids, image_grid_thw=torch.tensor(grid), attention_mask=torch.tensor(mask),
        mm_token_type_ids=(ids == IMAGE).int())
  np.testing.assert_array_equal(positions, hf_pos.numpy())
  np.testing.assert_array_equal(deltas, hf_deltas.numpy()[:, 0])
  valid = mask.astype(bool)
  diff = np.abs(np.asarray(ours) - out.logits.numpy())[valid]
  assert diff.max() <= 1e-4, diff.max()


def test_text_rows_are_plain_rope(tiny):
  """Without images, [3, B, S] positions of equal components = the text forward at [B, S]."""
  _, _, cfg, params = tiny
  rng = np.random.default_rng(2)
  tokens = rng.integers(3, 110, (2, 7)).astype(np.int32)
  mask = np.ones_like(tokens)
  rows = multimodal.row_images(cfg, tokens, mask, np.zeros((0, 96)), np.zeros((0, 3)))
  from rljax.models import transformer
  ours, text = jax.jit(lambda p: (multimodal.logits(cfg, p, tokens, mask, rows),
                                  transformer.logits(cfg, p, tokens, mask)))(params)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(text), atol=1e-6)


def test_placeholder_mismatch_is_one_error(tiny, images):
  _, _, cfg, _ = tiny
  _, grid = images
  tokens = np.array([[5, START] + [IMAGE] * 3 + [END]], np.int32)
  with pytest.raises(ValueError, match="needs 4 placeholder tokens, found a run of 3"):
    multimodal.rope_index(tokens, np.ones_like(tokens), grid[:1], qwen2_5_vl.vision_config(cfg))
  with pytest.raises(ValueError, match="more image placeholders than the 0 images"):
    multimodal.rope_index(tokens, np.ones_like(tokens), np.zeros((0, 3)),
                          qwen2_5_vl.vision_config(cfg))
  with pytest.raises(ValueError, match="2 images but placeholders for 0"):
    multimodal.rope_index(tokens[:, :1], np.ones((1, 1)), grid[:2], qwen2_5_vl.vision_config(cfg))
  text_only = ModelConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=1,
                          num_heads=2, num_kv_heads=2, head_dim=8, model_type="qwen2")
  with pytest.raises(ValueError, match="model_type='qwen2' has no vision tower"):
    multimodal.row_images(text_only, tokens, np.ones_like(tokens), np.zeros((16, 96)), grid[:1])


def test_sampler_refuses_images_with_continuous_batching(tiny, images):
  from rljax.rollout import SamplingParams, sample
  _, _, cfg, params = tiny
  pixels, grid = images
  tokens, mask = _prompts(grid)
  sp = SamplingParams(greedy=True, max_new_tokens=2, stop_ids=(), pad_id=0)
  with pytest.raises(ValueError, match="prompts with images sample all rows at once"):
    sample(cfg, params, tokens, mask, jax.random.key(0), sp, max_concurrent_rows=1,
           images=multimodal.row_images(cfg, tokens, mask, pixels, grid))


def test_export_round_trip(tiny, tmp_path):
  """load -> save: every tensor bit-identical, and transformers loads the export."""
  path, model, cfg, params = tiny
  out = str(tmp_path / "export")
  hf_tiny.assert_export_round_trip(path, cfg, params, out)
  again = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(out)
  assert again.config.vision_config.fullatt_block_indexes == [1]
  assert again.config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]


def test_language_model_prefix_loads(tiny, tmp_path):
  """The names transformers 4.52-4.57 wrote (model.visual.*, model.language_model.*) load as
  the same parameters."""
  path, _, cfg, params = tiny
  renamed = {("model." + n if n.startswith("visual.") else
              n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n): v
             for n, v in hf.iter_hf_tensors(path)}
  out = tmp_path / "renamed"
  out.mkdir()
  hf.write_safetensors(renamed, str(out / "model.safetensors"))
  with open(os.path.join(path, "config.json")) as f, open(out / "config.json", "w") as g:
    g.write(f.read())
  _, loaded = hf.load_hf(str(out))
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_lora_export_loads_in_peft_with_rljax_logits(tiny, images, tmp_path):
  """LoRA on the language model of a Qwen2.5-VL policy (every projection, rank 4, alpha 8):
  rljax's forward with random non-zero factors on rows with images, against ``peft`` loading
  rljax's PEFT export over ``transformers``' model of the same base; the tower has no adapters
  (in rljax or in peft), rljax reads its export back factor for factor."""
  peft = pytest.importorskip("peft")
  from rljax.models import lora
  from rljax.models import peft as rpeft
  path, _, cfg, params = tiny
  cfg = cfg.replace(lora_rank=4, lora_alpha=8.0, lora_targets=lora.TARGETS)
  shapes = lora.adapter_shapes(cfg, params)
  assert "visual" not in shapes and len(jax.tree.leaves(
      shapes, is_leaf=lambda x: isinstance(x, tuple))) == 2 * 7 * cfg.num_layers
  rng = np.random.default_rng(2)
  adapters = jax.tree.map(lambda s: (0.1 * rng.standard_normal(s)).astype(np.float32), shapes,
                          is_leaf=lambda x: isinstance(x, tuple))
  pixels, grid = images
  tokens, mask = _batch(grid)
  rows = multimodal.row_images(cfg, tokens, mask, pixels, grid)
  ours = np.asarray(jax.jit(functools.partial(multimodal.logits, cfg))(
      lora.join_adapters(params, adapters), tokens, mask, rows))
  out = str(tmp_path / "adapter")
  rpeft.save_peft_adapter(out, cfg, adapters, base_model=path)
  base = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
  theirs = peft.PeftModel.from_pretrained(base, out).eval()
  adapted = {n for n, _ in theirs.named_modules() if n.endswith(".lora_A")}
  assert len(adapted) == 7 * cfg.num_layers and not any("visual" in n for n in adapted)
  with torch.no_grad():
    ids = torch.tensor(tokens, dtype=torch.long)
    logits = theirs(input_ids=ids, attention_mask=torch.tensor(mask),
                    pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grid),
                    mm_token_type_ids=(ids == IMAGE).int()).logits.numpy()
  valid = mask.astype(bool)
  diff = np.abs(ours - logits)[valid].max()
  assert diff <= 1e-4, diff
  base_logits = np.asarray(jax.jit(functools.partial(multimodal.logits, cfg.base))(
      params, tokens, mask, rows))
  assert np.abs(base_logits - logits)[valid].max() > 100 * 1e-4  # the adapters matter
  again = rpeft.load_peft_adapter(out, cfg)
  for (p, a), (_, b) in zip(hf._flat_paths(adapters), hf._flat_paths(again)):
    np.testing.assert_array_equal(np.asarray(b), a, err_msg="/".join(p))


# --- the sampler ----------------------------------------------------------------------------------

T = 6


def _prompts(grid):
  """Left-padded prompts: two images amid text, one image, text only (ending in text)."""
  return _batch(grid)


def test_greedy_equals_transformers_generate(tiny, images):
  from rljax.rollout import SamplingParams, sample
  _, model, cfg, params = tiny
  pixels, grid = images
  tokens, mask = _prompts(grid)
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
  # The engine a run samples through hands the images on (the same compiled sampler).
  from rljax.rollout.engines import JaxEngine
  engine = JaxEngine(cfg)
  engine.load_weights(engine.transfer(params)[0], 0)
  got = engine.generate(tokens, mask, jax.random.key(0), sp, 1,
                        images=multimodal.row_images(cfg, tokens, mask, pixels, grid))
  np.testing.assert_array_equal(got.tokens, r.tokens)
  assert got.extras["images"].pixels.shape == (3, 48, 96)


def test_tower_runs_once_per_prompt_and_logp_matches_teacher_forcing(tiny, images, monkeypatch):
  """Groups of 3 sampled: the tower is traced once, over the prompts' patches only; each
  completion's sampler log-probs equal the learner's scoring forward, which runs the tower again
  over the images the record carries."""
  from rljax.rollout import SamplingParams, sample
  _, _, cfg, params = tiny
  pixels, grid = images
  tokens, mask = _prompts(grid)
  seen, rows_seen = [], []
  call, embed = qwen2_5_vl.VisionTower.__call__, multimodal.row_embeddings

  def counted(self, x, lay):
    seen.append(x.shape[0])
    return call(self, x, lay)

  def rows_counted(cfg, model, tokens, images):
    rows_seen.append(images.pixels.shape[0])
    return embed(cfg, model, tokens, images)

  monkeypatch.setattr(qwen2_5_vl.VisionTower, "__call__", counted)
  monkeypatch.setattr(multimodal, "row_embeddings", rows_counted)
  sp = SamplingParams(temperature=1.0, max_new_tokens=T, stop_ids=(), pad_id=0)
  g = 3
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(1), sp, group_size=g,
                            images=multimodal.row_images(cfg, tokens, mask, pixels, grid)))
  # One tower call (vmapped over rows of 48 padded patches), over the 3 prompts, not 3 x g rows.
  assert seen == [48] and rows_seen == [3]
  assert r.extras["images"].pixels.shape[0] == 3 * g
  from rljax.learner import step
  chunks = step.update_lib.RowSplit(parts=3)  # rows carry their images through the chunk scan
  logp, _, _ = jax.jit(lambda p: step.policy_stats(cfg, p, r, 8, chunks))(params)
  assert np.abs(np.asarray(logp) - r.sampler_logp)[r.mask == 1].max() <= 1e-5


def test_tiny_model_is_a_transformers_model(tmp_path):
  """model.source='tiny' with model.family='qwen2_5_vl': a tower for the processor's 14-pixel
  patches, the placeholders as the last three ids ('char_vl''s order), exported and run by
  transformers with the same logits."""
  from rljax import models
  from rljax.config import loader
  from rljax.models import transformer
  from tests.train import tiny as tiny_run
  config = loader.load_config(os.path.join(tiny_run.ROOT, "configs", "base.py"),
                              [(k, v) for k, v in tiny_run.OVERRIDES.items()
                               if k.startswith("model.")] + [("model.family", "qwen2_5_vl")])
  cfg = models.tiny_config(config.model, 60, eos_token_id=1, pad_token_id=0)
  vision = qwen2_5_vl.vision_config(cfg)
  assert (vision["vision_start_token_id"], vision["image_token_id"],
          vision["vision_end_token_id"]) == (57, 58, 59)
  params = transformer.init_params(cfg, seed=0)
  hf.save_hf(str(tmp_path), cfg, params)
  model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  proc = transformers.Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, min_pixels=28 * 28)
  pic = np.random.default_rng(3).integers(0, 256, (28, 56, 3), dtype=np.uint8)
  out = proc(images=[pic], return_tensors="np")
  pixels, grid = out["pixel_values"].astype(np.float32), out["image_grid_thw"]
  tokens = np.array([[5, 57, 58, 58, 59, 6, 7]], np.int32)
  mask = np.ones_like(tokens)
  ours = jax.jit(functools.partial(multimodal.logits, cfg))(
      params, tokens, mask, multimodal.row_images(cfg, tokens, mask, pixels, grid))
  with torch.no_grad():
    ids = torch.tensor(tokens, dtype=torch.long)
    theirs = model(input_ids=ids, attention_mask=torch.tensor(mask),
                   pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grid),
                   mm_token_type_ids=(ids == 58).int()).logits.numpy()
  assert np.abs(np.asarray(ours) - theirs).max() <= 1e-4


_SHARDED = r"""
import jax, numpy as np
from jax.sharding import Mesh
from rljax.models import ModelConfig, transformer
from rljax.rollout import SamplingParams, make_sampler, sample
from rljax.vision import multimodal, qwen2_5_vl
assert jax.device_count() == 8
vision = dict(qwen2_5_vl.VISION_DEFAULTS, depth=2, hidden_size=32, intermediate_size=64,
              num_heads=2, fullatt_block_indexes=(1,), patch_size=4, window_size=16,
              out_hidden_size=16,
              vision_start_token_id=29, image_token_id=30, vision_end_token_id=31,
              video_token_id=32)
cfg = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=8, qkv_bias=True, model_type="qwen2_5_vl",
                  mrope_section=(1, 1, 2), vision=vision)
params = transformer.init_params(cfg, 0)
rng = np.random.default_rng(0)
grids, rows = [], []
for r in range(8):  # 0, 1 or 2 images of 2x2 to 4x6 patches amid text
  row = list(rng.integers(1, 29, 2))
  for _ in range(r % 3):
    g = (1, 2 * int(rng.integers(1, 3)), 2 * int(rng.integers(1, 4)))
    grids.append(g)
    row += [29] + [30] * (g[1] * g[2] // 4) + [31] + list(rng.integers(1, 29, 2))
  rows.append(row)
width = max(map(len, rows))
tokens = np.zeros((8, width), np.int32); mask = np.zeros_like(tokens)
for i, row in enumerate(rows):
  tokens[i, width - len(row):], mask[i, width - len(row):] = row, 1
grid = np.array(grids)
pixels = rng.standard_normal((int(np.prod(grid, 1).sum()), 96)).astype(np.float32)
images = multimodal.row_images(cfg, tokens, mask, pixels, grid)
sp = SamplingParams(max_new_tokens=4, temperature=1.0, stop_ids=())
mesh = Mesh(np.array(jax.devices()), ("data",))
got = make_sampler(cfg, sp, group_size=2, mesh=mesh)(params, tokens, mask, jax.random.key(1),
                                                     images=images)
assert {s.data.shape for s in got.tokens.addressable_shards} == {(2, 4)}
want = sample(cfg, params, tokens, mask, jax.random.key(1), sp, group_size=2, images=images)
np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
np.testing.assert_allclose(np.asarray(got.sampler_logp), np.asarray(want.sampler_logp), atol=1e-5)
np.testing.assert_array_equal(np.asarray(got.extras["images"].positions),
                              np.asarray(want.extras["images"].positions))
print("OK")
"""


@pytest.mark.slow
def test_eight_device_mesh_equals_one_device_with_images():
  """make_sampler over 8 simulated devices splits the prompts' images by rows like the prompts
  (one prompt a shard, rows with 0-2 images) and returns the one-device rollout."""
  import subprocess
  import sys
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


@functools.lru_cache(maxsize=None)
def _grpo_policy():
  """(GRPO config, tiny qwen2_5_vl cfg, params) of the tiny run's settings."""
  from rljax import models
  from rljax.config import loader
  from tests.train import tiny as tiny_run
  config = loader.load_config(os.path.join(tiny_run.ROOT, "configs", "algos", "grpo.py"),
                              list(dict(tiny_run.OVERRIDES, **{"model.family": "qwen2_5_vl"})
                                   .items()))
  cfg = models.tiny_config(config.model, 60)
  return config, cfg, models.init_params(cfg, seed=0)


@functools.lru_cache(maxsize=None)
def _grpo_rollout():
  """(GRPO config, tiny qwen2_5_vl cfg, params, a scored-ready rollout of 2 prompts with images
  x 4 completions), shared by the tower's trainable / frozen steps."""
  from rljax.rollout import SamplingParams, sample
  config, cfg, params = _grpo_policy()
  rng = np.random.default_rng(4)
  grid = np.array([[1, 2, 2], [1, 2, 4]])  # 28x28 and 28x56 pixels: 1 and 2 image tokens
  pixels = rng.standard_normal((int(np.prod(grid, 1).sum()), 3 * 2 * 14 * 14)).astype(np.float32)
  tokens = np.array([[0, 5, 57, 58, 59, 6], [57, 58, 58, 59, 7, 8]], np.int32)
  mask = (np.arange(6)[None] >= np.array([[1], [0]])).astype(np.int32)
  sp = SamplingParams(temperature=1.0, max_new_tokens=4, stop_ids=(), pad_id=0)
  r = sample(cfg, params, tokens, mask, jax.random.key(0), sp, group_size=4,
             images=multimodal.row_images(cfg, tokens, mask, pixels, grid))
  rewards = np.array([1, 0, 0, 1, 0, 1, 1, 0], np.float32)
  r = jax.device_get(r).replace(rewards=rewards, correct=rewards > 0,
                                row_valid=np.ones(8, np.float32))
  return config, cfg, params, r


@pytest.mark.slow
@pytest.mark.parametrize("tower", ["trained", "frozen", "lora"])
def test_grpo_step_with_images_trains_or_freezes_the_tower(tower):
  """A tiny qwen2_5_vl policy (model.source='tiny') samples groups for prompts with images, and
  one GRPO step scores them (reference log-probs equal the sampler's) and moves the language
  model; with model.vision.trainable=True ('trained') every weight moves, the tower's included;
  with False ('frozen') no tower weight does (bit for bit) and the optimizer holds no state for
  it; with LoRA (rank 4 on every projection of the language model) every lora_B moves and the
  base, the tower included, stays bit for bit, with optimizer state for the adapters only."""
  from rljax.algorithm import resolve
  from rljax.learner import step as step_lib
  from rljax.models import lora
  from rljax.train import build
  config, cfg, params, r = _grpo_rollout()
  if tower == "frozen":
    cfg = cfg.replace(vision_trainable=False)
  if tower == "lora":
    cfg = cfg.replace(lora_rank=4, lora_alpha=8.0, lora_targets=lora.TARGETS)
    params = lora.with_adapters(cfg, params, seed=0)  # B = 0: the sampler's policy exactly
  algo = resolve(config)
  _, make = build.abstract_state(config, cfg, algo)
  fns, state = step_lib.step_fns(build.step_spec(config, cfg, algo)), make(params)
  tower_leaves = len(jax.tree.leaves(params["visual"]))
  paths = [jax.tree_util.keystr(p) for p, leaf in
           jax.tree_util.tree_flatten_with_path(state.opt_state)[0] if np.ndim(leaf)]
  assert sum("visual" in p for p in paths) == (2 * tower_leaves if tower == "trained" else 0)
  if tower == "lora":  # AdamW's mu and nu of the adapters only
    assert len(paths) == 2 * 2 * 7 * cfg.num_layers and all("lora_" in p for p in paths)
  batch, _ = jax.jit(fns.score)(state, r, algo.hparams)
  scored = batch.old_logp if batch.old_logp is not None else batch.ref_logp  # GRPO: the KL's
  assert np.abs(np.asarray(scored) - r.sampler_logp)[r.mask == 1].max() <= 1e-5
  new_state, metrics = jax.jit(fns.train_step)(state, batch, algo.hparams)
  assert np.isfinite(float(metrics["loss"][0]))
  moved = lambda new, old: jax.tree.leaves(jax.tree.map(
      lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), new, old))
  base, adapters = lora.split_adapters(params)
  new_base, new_adapters = lora.split_adapters(new_state.params)
  language = {k: v for k, v in base.items() if k != "visual"}
  tower_moved = moved(new_base["visual"], base["visual"])
  assert len(tower_moved) == tower_leaves
  if tower == "lora":
    assert max(moved(new_base, base)) == 0
    b_moved = [m for path, m in zip(
        [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(adapters)[0]],
        moved(new_adapters, adapters)) if "lora_b" in path]
    assert len(b_moved) == 7 * cfg.num_layers and min(b_moved) > 0
    return
  assert min(moved({k: new_base[k] for k in language}, language)) > 0
  if tower == "trained":
    assert min(tower_moved) > 0
  else:
    assert max(tower_moved) == 0


@pytest.mark.slow
def test_packed_rows_with_images_equal_the_padded_rows():
  """The learner's forward over packed rows (two sequences with images sharing a packed row,
  two chunks) gives each completion token the log-prob and entropy of the padded forward, and
  the same gradient of the policy, tower included (float32)."""
  from rljax.learner import packing
  from rljax.learner import step as step_lib
  from rljax.learner import update as update_lib
  from rljax.rollout import SamplingParams, sample
  _, cfg, params = _grpo_policy()
  rng = np.random.default_rng(5)
  grid = np.array([[1, 2, 2], [1, 2, 2]])  # one image token each
  pixels = rng.standard_normal((8, 3 * 2 * 14 * 14)).astype(np.float32)
  tokens = np.array([[0, 0, 0, 0, 0, 57, 58, 59], [0, 0, 0, 0, 57, 58, 59, 6]], np.int32)
  mask = (tokens > 0).astype(np.int32)
  sp = SamplingParams(temperature=1.0, max_new_tokens=4, stop_ids=(), pad_id=0)
  r = sample(cfg, params, tokens, mask, jax.random.key(3), sp, group_size=2,
             images=multimodal.row_images(cfg, tokens, mask, pixels, grid))
  # completions of 2, 3, 1 and 4 tokens: sequences of 5, 6, 5, 8 in packed rows of 12
  kept = np.arange(4)[None] < np.array([[2], [3], [1], [4]])
  r = jax.device_get(r).replace(mask=(np.asarray(r.mask) * kept).astype(np.asarray(r.mask).dtype))
  _, valid = step_lib.sequence_inputs(r)
  lay = packing.layout(valid, packing.chunk_shape(4, 12, 2))
  assert lay.shape == (2, 2, 12) and int(lay.used_chunks) == 2
  assert len(set(np.asarray(lay.row).tolist())) == 3  # two sequences share a packed row

  def objective(p, split):  # the completion's summed log-prob, and (logp, entropy) [B, T]
    logp, entropy, _ = step_lib.policy_stats(cfg, p, r, 16, split)
    return (logp * r.mask).sum(), (logp, entropy)

  grad = jax.grad(objective, has_aux=True)
  (g_padded, padded), (g_packed, packed) = (
      jax.jit(lambda p, split=split: grad(p, split))(params)
      for split in (update_lib.RowSplit(), step_lib.Packed(lay)))
  on = np.asarray(r.mask) == 1
  for a, b in zip(padded, packed):  # log-probs, entropies
    assert np.abs(np.asarray(a) - np.asarray(b))[on].max() <= 1e-5
  assert float(np.abs(np.asarray(jax.tree.leaves(g_padded["visual"])[0])).max()) > 0
  for a, b in zip(jax.tree.leaves(g_padded), jax.tree.leaves(g_packed)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4)

"""`rljax train` on the embedded visual task with a tiny Qwen2.5-VL, Qwen3-VL and Gemma 3 policy:
the loop encodes the prompts with their images in each family's format, the engine samples with
them and the learner updates on them; what does not take images is refused in one line."""
import os

import jax
import numpy as np
import pytest

from rljax.config import checks as config_checks
from rljax.config import loader as config_loader
from rljax.errors import ConfigError
from rljax.rollout import engines
from rljax.train import loop

GRPO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "algos", "grpo.py")
VISUAL = {
    "model.source": "tiny", "model.family": "qwen2_5_vl", "data.tokenizer": "char_vl",
    "data.source": "embedded:visual_arithmetic", "data.difficulty": "0",
    "data.prompt_bucket": "8", "data.num_eval": "2",
    "model.hidden_size": "32", "model.intermediate_size": "64", "model.num_layers": "1",
    "model.num_heads": "2", "model.num_kv_heads": "1",
    "rollout.max_new_tokens": "4", "rollout.prompts_per_step": "2", "rollout.group_size": "2",
    "optim.lr": "1e-3", "critic.pretrain_steps": "0", "mesh.cpu_devices": "1",
    "train.steps": "2", "train.progress": "false", "train.export_hf": "false",
}


def _config(run_dir=None, **extra):
  values = dict(VISUAL, **extra)
  if run_dir is not None:
    values["train.run_dir"] = str(run_dir)
  return config_loader.load_config(GRPO, list(values.items()))


def test_train_on_images(tmp_path, monkeypatch):
  """Two GRPO steps and the evals before and after: every sampler call gets each prompt's
  image (a 28 x 84 image: 1 x 2 x 6 patches of 14 pixels, 3 image tokens after the placeholder
  start) and the record carries them to the learner, whose log-probs equal the sampler's; the
  step's metrics are finite."""
  seen = []
  generate = engines.JaxEngine.generate

  def recorded(self, tokens, mask, key, sampling, group_size, images=None, **kw):
    out = generate(self, tokens, mask, key, sampling, group_size, images=images, **kw)
    seen.append((np.asarray(tokens), images, out.extras.get("images")))
    return out

  monkeypatch.setattr(engines.JaxEngine, "generate", recorded)
  result = loop.train(_config(tmp_path / "run"))
  # eval before (2 problems), 2 steps (2 prompts each), eval after
  assert len(seen) == 4
  for tokens, images, carried in seen:
    assert images is not None
    pixels = np.asarray(images.pixels)
    assert pixels.shape[1] >= 12 and pixels.shape[2] == 3 * 2 * 14 * 14
    assert (np.abs(pixels[:, :12]).sum(axis=(1, 2)) > 0).all()  # each row its own image
    assert (np.abs(pixels[:, 12:]).sum() == 0)  # the rest is padding
    assert ((tokens == 58).sum(axis=1) == 3).all()  # char_vl's <|image_pad|>, 3 per image
    assert carried is not None and carried.pixels.shape[0] % tokens.shape[0] == 0
  last = result["last"]
  # The learner's scoring forward reran the tower over the carried images: its log-probs are the
  # sampler's (without the images they would be another function's).
  assert last["logp_gap_max"] < 1e-4
  for name in ("loss", "reward_mean", "accuracy"):
    assert np.isfinite(last[name]), (name, last[name])
  assert 0.0 <= result["eval_after"] <= 1.0


# Per family: (patch rows a prompt's 28 x 84 image is, their width, the image tokens a prompt
# holds). Qwen3-VL: resized to 32 x 96 (multiples of 32), 16-pixel patches, grid 1 x 2 x 6
# merged 2 x 2; Gemma 3: one 28 x 28 image (the tiny tower's image_size), one soft token.
FAMILY_IMAGES = {"qwen3_vl": ((12,), 3 * 2 * 16 * 16, 3), "gemma3": ((1,), (3, 28, 28), 1)}


@pytest.mark.parametrize("family", ["qwen3_vl", "gemma3"])
def test_train_on_images_in_each_family_format(tmp_path, monkeypatch, family):
  """Two GRPO steps of a tiny Qwen3-VL / Gemma 3 policy: every sampler call gets each prompt's
  image in its family's format and the learner's log-probs equal the sampler's (its forward
  reran the tower over the carried images)."""
  seen = []
  generate = engines.JaxEngine.generate

  def recorded(self, tokens, mask, key, sampling, group_size, images=None, **kw):
    seen.append((np.asarray(tokens), images))
    return generate(self, tokens, mask, key, sampling, group_size, images=images, **kw)

  monkeypatch.setattr(engines.JaxEngine, "generate", recorded)
  result = loop.train(_config(tmp_path / "run", **{"model.family": family}))
  (held,), shape, tokens_per_image = FAMILY_IMAGES[family]
  assert len(seen) == 4
  for tokens, images in seen:
    pixels = np.asarray(images.pixels)
    assert pixels.shape[2:] == (shape if isinstance(shape, tuple) else (shape,))
    assert (np.abs(pixels[:, :held]).reshape(len(pixels), -1).sum(1) > 0).all()
    assert np.abs(pixels[:, held:]).sum() == 0  # padding
    assert ((tokens == 58).sum(axis=1) == tokens_per_image).all()  # char_vl's image token
  last = result["last"]
  assert last["logp_gap_max"] < 1e-4
  for name in ("loss", "reward_mean", "accuracy"):
    assert np.isfinite(last[name]), (name, last[name])


@pytest.mark.parametrize("extra, error", [
    ({"model.family": "llama", "data.tokenizer": "char"},
     "model.family='llama' takes no images in a run"),
    ({"rollout.engine": "continuous"}, "only single-turn all_rows rollouts"),
    ({"rollout.inflight_chunk": "2", "rollout.max_staleness": "1"},
     "only single-turn all_rows rollouts"),
])
def test_what_takes_no_images_is_refused(extra, error):
  with pytest.raises(ConfigError, match=error):
    config_checks.check_config(_config(**extra))


def test_sft_cold_start_reads_the_images(monkeypatch):
  """The cold start's examples hold each prompt's image as its placeholders (the sampler's
  prompt), only the solution and EOS are learned, and its update trains the tower on them."""
  from rljax.data import load_tokenizer, make_task
  from rljax.train import sft
  from rljax.vision import multimodal
  config = _config(**{"sft.steps": "2", "sft.batch_size": "4", "sft.warmup_steps": "1",
                     "rollout.max_new_tokens": "12"})
  tok = load_tokenizer("char_vl")
  model_cfg, processor = sft.cold_start_policy(config, tok)
  assert processor is not None and model_cfg.vision is not None
  problem = make_task("visual_arithmetic", 0).eval_set(seed=0, n=1)[0]
  ids, learn = sft.encode_example(tok, problem, processor=processor)
  solution = tok.encode(problem.solution) + [tok.eos_id]
  # BOS, <|vision_start|>, 3 x <|image_pad|> (a 1 x 2 x 6 grid), <|vision_end|>, '='
  assert ids == [tok.bos_id, 57, 58, 58, 58, 59, tok.encode("=")[0]] + solution
  assert learn == [0] * 7 + [1] * len(solution)
  tokens, _, loss, images = sft.image_batch(model_cfg, tok, [problem], 20, processor)
  assert tokens[0, -len(ids):].tolist() == ids and loss[0, -len(ids):].tolist() == learn
  assert images.pixels.shape == (1, 16, 3 * 2 * 14 * 14)  # 12 patches, padded to 16
  forwards = []
  forward_rows = multimodal.forward_rows

  def counted(cfg, params, tokens, attn, images, head="lm"):
    forwards.append(images.pixels.shape)
    return forward_rows(cfg, params, tokens, attn, images, head)

  monkeypatch.setattr(multimodal, "forward_rows", counted)
  from rljax.models import transformer
  before = transformer.init_params(model_cfg, seed=config.sft.seed)
  _, params = sft.train_sft(config, tok, log=lambda line: None)
  assert forwards and all(shape[0] == 4 and shape[2] == 3 * 2 * 14 * 14 for shape in forwards)
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max())
           for a, b in zip(jax.tree.leaves(before["visual"]), jax.tree.leaves(params["visual"]))]
  assert all(np.isfinite(moved)) and max(moved) > 0


@pytest.mark.parametrize("extra, error", [
    ({"model.family": "llama", "data.tokenizer": "char", "data.source": "embedded:arithmetic"},
     "is a llama model without an image tower"),
    ({"model.lora.rank": "4"}, "the tower has none"),
])
def test_frozen_tower_key_needs_a_tower_and_no_adapters(extra, error):
  """model.vision.trainable=False is read only by a vision-language policy without adapters (with
  LoRA the tower is part of the frozen base already): otherwise refused in one line."""
  from rljax import models
  config = _config(**{"model.vision.trainable": "False", **extra})
  with pytest.raises(ConfigError, match=error):
    config_checks.check_unused(config, None, models.tiny_config(config.model, 60))


def test_sft_cold_start_keeps_a_frozen_tower():
  """model.vision.trainable=False: the cold start's updates leave every tower weight as it was
  initialised (bit for bit) and move the language model's."""
  from rljax.data import load_tokenizer
  from rljax.models import transformer
  from rljax.train import sft
  config = _config(**{"sft.steps": "2", "sft.batch_size": "4", "sft.warmup_steps": "1",
                     "rollout.max_new_tokens": "12", "model.vision.trainable": "False"})
  tok = load_tokenizer("char_vl")
  model_cfg, _ = sft.cold_start_policy(config, tok)
  assert not model_cfg.vision_trainable
  before = transformer.init_params(model_cfg, seed=config.sft.seed)
  _, params = sft.train_sft(config, tok, log=lambda line: None)
  for a, b in zip(jax.tree.leaves(before["visual"]), jax.tree.leaves(params["visual"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  language = {k: v for k, v in params.items() if k != "visual"}
  diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b))
                                                          .max()),
                                       language, {k: before[k] for k in language}))
  assert min(diffs) > 0


def test_tiny_gemma3_saved_config_reads_back(tmp_path):
  """The SFT cold start saves a tiny Gemma 3 (no local RoPE base: its sliding layers use
  rope_theta) and the RL run reads it back: the export writes that base as a number, and the
  config read back is the one saved (a null base was unreadable)."""
  from rljax import models
  from rljax.models import hf, transformer
  config = _config(**{"model.family": "gemma3"})
  cfg = models.tiny_config(config.model, 60, eos_token_id=1, pad_token_id=0).base
  assert cfg.rope_local_theta is None
  hf.save_hf(str(tmp_path), cfg, transformer.init_params(cfg, seed=0))
  back = hf.check_hf_dir(str(tmp_path))
  assert back.rope_local_theta == cfg.rope_theta
  assert back.replace(rope_local_theta=None) == cfg.replace(dtype=back.dtype,
                                                           param_dtype=back.param_dtype)


def test_tower_sizes_are_keys():
  """model.vision.* size the fresh tower and its processor: 7-pixel patches turn a 28 x 84 image
  into a 4 x 12 grid, 12 image tokens after the 2x2 merge (28 * 84 / 14^2), one per ~1 glyph."""
  from rljax.data import load_tokenizer, make_task
  from rljax.train import sft
  config = _config(**{"model.vision.patch_size": "7", "model.vision.hidden_size": "48",
                      "model.vision.depth": "3", "model.vision.num_heads": "4",
                      "model.vision.intermediate_size": "96"})
  tok = load_tokenizer("char_vl")
  model_cfg, processor = sft.cold_start_policy(config, tok)
  v = dict(model_cfg.vision)
  assert (v["patch_size"], v["hidden_size"], v["depth"], v["num_heads"]) == (7, 48, 3, 4)
  assert v["intermediate_size"] == 96 and tuple(v["fullatt_block_indexes"]) == (2,)
  problem = make_task("visual_arithmetic", 0).eval_set(seed=0, n=1)[0]
  ids, _ = sft.encode_example(tok, problem, processor=processor)
  assert ids[:2] == [tok.bos_id, 57] and ids[2:14] == [58] * 12 and ids[14] == 59


def test_tower_head_size_is_checked():
  from rljax.data import load_tokenizer
  from rljax.train import sft
  config = _config(**{"model.vision.hidden_size": "30", "model.vision.num_heads": "4"})
  with pytest.raises(ConfigError, match="head size .* must be a whole multiple of 4"):
    sft.cold_start_policy(config, load_tokenizer("char_vl"))

"""Mistral's sliding window against ``transformers`` MistralForCausalLM (issue 13, defect 1):
logits of the forward (every CPU attention backend), export and reload, and greedy generation
through the sampler (prefill + decode steps over a cache longer than the window)."""
import json
import os

import jax
import numpy as np
import pytest

from rljax import models
from rljax.models import transformer
from rljax.rollout import SamplingParams, sample
from tests import hf_models

WINDOW = 4


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
  import torch
  import transformers
  torch.manual_seed(0)
  hf_cfg = transformers.MistralConfig(
      vocab_size=hf_models.VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
      max_position_embeddings=256, sliding_window=WINDOW, eos_token_id=2, bos_token_id=1,
      pad_token_id=0, tie_word_embeddings=False)
  model = transformers.MistralForCausalLM(hf_cfg).to(torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  path = str(tmp_path_factory.mktemp("mistral") / "m")
  model.save_pretrained(path)
  return path


@pytest.fixture(scope="module")
def batch():
  """11-token rows (and shorter, left-padded): all longer than the window."""
  return hf_models.left_padded([11, 8, 6], width=11, vocab=hf_models.VOCAB, seed=3)


def test_config_reads_the_window(mistral_dir):
  cfg, _ = models.load_hf(mistral_dir)
  assert cfg.sliding_window == WINDOW


@pytest.mark.parametrize("backend", ["xla", "blockwise", "pallas"])
def test_logits_match_transformers_with_window(backend, mistral_dir, batch):
  tokens, mask = batch
  cfg, params = models.load_hf(mistral_dir)
  cfg = cfg.replace(attention=backend)
  ours = np.asarray(jax.jit(transformer.logits, static_argnums=0)(cfg, params, tokens, mask))
  theirs = hf_models.hf_logits(mistral_dir, tokens, mask)
  valid = mask.astype(bool)
  assert np.abs(ours - theirs)[valid].max() <= 1e-4
  # The window matters here: without it the logits are far off.
  unwindowed = np.asarray(transformer.logits(cfg.replace(sliding_window=None), params, tokens, mask))
  assert np.abs(unwindowed - theirs)[valid].max() > 1e-2


def test_export_writes_the_window(mistral_dir, batch, tmp_path):
  tokens, mask = batch
  cfg, params = models.load_hf(mistral_dir)
  models.save_hf(str(tmp_path), cfg, params)
  with open(os.path.join(tmp_path, "config.json")) as f:
    assert json.load(f)["sliding_window"] == WINDOW
  ours = np.asarray(transformer.logits(cfg, params, tokens, mask))
  reloaded = hf_models.hf_logits(str(tmp_path), tokens, mask)
  assert np.abs(ours - reloaded)[mask.astype(bool)].max() <= 1e-4


def test_greedy_generation_matches_transformers(mistral_dir, batch):
  import torch
  import transformers
  tokens, mask = batch
  steps = 12
  model = transformers.AutoModelForCausalLM.from_pretrained(mistral_dir, dtype=torch.float32)
  with torch.no_grad():
    out = model.eval().generate(input_ids=torch.tensor(tokens, dtype=torch.long),
                                attention_mask=torch.tensor(mask, dtype=torch.long),
                                max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                pad_token_id=0)
  theirs = out[:, tokens.shape[1]:].numpy()
  cfg, params = models.load_hf(mistral_dir)
  sp = SamplingParams(greedy=True, max_new_tokens=steps, stop_ids=(), pad_id=0)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(0), sp))
  np.testing.assert_array_equal(r.tokens, theirs)

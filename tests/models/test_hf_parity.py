"""rljax logits against ``transformers`` on tiny random checkpoints, export and reload."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rljax import models
from rljax.models import transformer
from tests import hf_models

_logits = jax.jit(transformer.logits, static_argnums=0)


@pytest.mark.parametrize("arch", hf_models.ARCHS)
def test_logits_match_transformers(arch, hf_dirs, left_padded_batch):
  tokens, mask = left_padded_batch
  cfg, params = models.load_hf(hf_dirs[arch])
  ours = np.asarray(_logits(cfg, params, tokens, mask))
  theirs = hf_models.hf_logits(hf_dirs[arch], tokens, mask)
  valid = mask.astype(bool)
  assert np.abs(ours - theirs)[valid].max() <= 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "llama_gqa_tied", "qwen3", "gemma3", "qwen3_moe"])
def test_export_reloads_in_transformers(arch, hf_dirs, left_padded_batch, tmp_path):
  tokens, mask = left_padded_batch
  cfg, params = models.load_hf(hf_dirs[arch])
  models.save_hf(str(tmp_path), cfg, params)
  ours = np.asarray(_logits(cfg, params, tokens, mask))
  reloaded = hf_models.hf_logits(str(tmp_path), tokens, mask)
  assert np.abs(ours - reloaded)[mask.astype(bool)].max() <= 1e-4


def test_sharded_checkpoint_roundtrip(hf_dirs, left_padded_batch, tmp_path):
  cfg, params = models.load_hf(hf_dirs["llama"])
  models.save_hf(str(tmp_path), cfg, params, max_shard_bytes=20_000)
  assert os.path.isfile(tmp_path / "model.safetensors.index.json")
  assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
  cfg2, params2 = models.load_hf(str(tmp_path))
  assert cfg2.replace() == cfg
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bf16_checkpoint_loads_as_bf16(hf_dirs, tmp_path):
  cfg, params = models.load_hf(hf_dirs["qwen2"])
  models.save_hf(str(tmp_path), cfg, params, dtype="bfloat16")
  cfg16, params16 = models.load_hf(str(tmp_path), param_dtype="bfloat16", dtype="bfloat16")
  assert {x.dtype for x in jax.tree.leaves(params16)} == {jnp.dtype("bfloat16")}
  ref = np.asarray(params["layers_0"]["mlp"]["up_proj"]["kernel"])
  got = np.asarray(params16["layers_0"]["mlp"]["up_proj"]["kernel"], np.float32)
  np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-3)


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


def test_missing_tensor_is_named(hf_dirs, tmp_path):
  path = _copy(hf_dirs["llama"], tmp_path / "m")
  tensors = load_file(os.path.join(path, "model.safetensors"))
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, os.path.join(path, "model.safetensors"))
  with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
    models.load_hf(path)


def test_wrong_shape_is_named(hf_dirs, tmp_path):
  path = _copy(hf_dirs["llama"], tmp_path / "m")
  tensors = load_file(os.path.join(path, "model.safetensors"))
  tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((3, 64), np.float32)
  save_file(tensors, os.path.join(path, "model.safetensors"))
  with pytest.raises(ValueError, match=r"k_proj\.weight.*\(3, 64\)"):
    models.load_hf(path)


def test_unsupported_architecture_is_named(hf_dirs, tmp_path):
  path = _copy(hf_dirs["llama"], tmp_path / "m")
  with open(os.path.join(path, "config.json")) as f:
    cfg = json.load(f)
  cfg["model_type"] = "gpt2"
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f)
  with pytest.raises(ValueError, match="gpt2"):
    models.load_hf(path)


def test_value_model_starts_from_policy_trunk(hf_dirs, left_padded_batch):
  tokens, mask = left_padded_batch
  cfg, policy = models.load_hf(hf_dirs["qwen2"])
  _, critic = models.load_hf(hf_dirs["qwen2"], head="value")
  assert "lm_head" not in critic and critic["value_head"]["kernel"].shape == (64, 1)
  h_policy = transformer.forward(cfg, policy, tokens, mask)
  h_critic = transformer.forward(cfg, critic, tokens, mask, head="value")
  np.testing.assert_array_equal(np.asarray(h_policy), np.asarray(h_critic))
  values = transformer.bind(cfg, critic, head="value").values(h_critic)
  assert values.shape == tokens.shape and np.isfinite(np.asarray(values)).all()


def test_check_conversion_reports_tiny_diff(hf_dirs):
  report = models.check_conversion(hf_dirs["llama3_rope"])
  assert report["max_abs_diff"] <= 1e-4 and 0 <= report["mean_kl"] <= 1e-8

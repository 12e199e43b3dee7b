"""Reward models (``head='score'``): scores equal to ``transformers``' ``*ForSequenceClassification``
on tiny random checkpoints, export reloaded by ``transformers``, and the one-line refusals."""
import json
import os

import jax
import numpy as np
import pytest

from rljax import models
from rljax.errors import ModelFileError
from rljax.models import transformer
from tests import hf_models

_scores = jax.jit(transformer.sequence_scores, static_argnums=0)


@pytest.fixture(scope="module")
def reward_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("rm")
  return {name: hf_models.build_reward_model(name, str(root / name), seed=3)
          for name in hf_models.REWARD_ARCHS}


@pytest.fixture(scope="module")
def rows():
  """Left-padded prompts (lengths 5, 3, 6, 1) then right-padded completions (4, 6, 1, 2): every
  row ends at a different column, and two end before the last one."""
  return hf_models.prompt_and_completion([5, 3, 6, 1], [4, 6, 1, 2], prompt_width=6,
                                         completion_width=6, vocab=hf_models.VOCAB, seed=1)


def test_last_valid_index_of_left_and_right_padded_rows(rows):
  _, mask = rows
  want = [max(np.nonzero(row)[0]) for row in mask]  # hand-read: the last 1 of each row
  assert list(np.asarray(transformer.last_valid_index(mask))) == want == [9, 11, 6, 7]


@pytest.mark.parametrize("arch", hf_models.REWARD_ARCHS)
def test_scores_match_transformers(arch, reward_dirs, rows, left_padded_batch):
  for tokens, mask in (rows, left_padded_batch):
    cfg, params = models.load_hf(reward_dirs[arch], head="score")
    ours = np.asarray(_scores(cfg, params, tokens, mask))
    theirs = hf_models.hf_scores(reward_dirs[arch], tokens, mask)
    assert ours.shape == (len(tokens),) and np.std(theirs) > 0.1  # rows differ: a real check
    assert np.abs(ours - theirs).max() <= 1e-4


def test_export_reloads_in_transformers_as_a_sequence_classifier(reward_dirs, rows, tmp_path):
  tokens, mask = rows
  cfg, params = models.load_hf(reward_dirs["qwen2"], head="score")
  models.save_hf(str(tmp_path), cfg, params)
  saved = json.load(open(tmp_path / "config.json"))
  assert saved["architectures"] == ["Qwen2ForSequenceClassification"]
  assert saved["id2label"] == {"0": "LABEL_0"} and saved["pad_token_id"] == 0
  ours = np.asarray(_scores(cfg, params, tokens, mask))
  assert np.abs(ours - hf_models.hf_scores(str(tmp_path), tokens, mask)).max() <= 1e-4


def test_a_causal_lm_is_not_a_reward_model(hf_dirs):
  with pytest.raises(ModelFileError, match=r"is not a sequence classifier .*LlamaForCausalLM"):
    models.load_hf(hf_dirs["llama"], head="score")
  with pytest.raises(ModelFileError, match="is not a sequence classifier"):
    models.check_hf_dir(hf_dirs["llama"], head="score")


def test_a_reward_model_is_not_a_causal_lm(reward_dirs):
  with pytest.raises(ModelFileError, match=r"is a sequence classifier \(score\.weight\)"):
    models.load_hf(reward_dirs["llama"])


def test_a_classifier_of_two_labels_is_refused(tmp_path):
  path = hf_models.build_reward_model("llama", str(tmp_path / "two"), num_labels=2)
  with pytest.raises(ModelFileError, match="with 2 labels; a reward model has one") as e:
    models.load_hf(path, head="score")
  assert "\n" not in str(e.value)


def test_export_of_a_reward_model_needs_a_pad_id(reward_dirs, tmp_path):
  cfg, params = models.load_hf(reward_dirs["llama"], head="score")
  with pytest.raises(ValueError, match="needs pad_token_id"):
    models.save_hf(str(tmp_path), cfg.replace(pad_token_id=None), params)
  assert not os.path.exists(tmp_path / "config.json")

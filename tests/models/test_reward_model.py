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


@pytest.mark.parametrize("pad", [True, False], ids=["pad_token", "no_pad_token"])
def test_export_scores_where_transformers_pools_with_and_without_a_pad_token(pad, tmp_path):
  """The reward model as ``rljax rm`` exports it (its padding id the tokenizer's: EOS for a
  tokenizer without a pad token) and rows as it encodes them (prompt, response, EOS; left-padded
  with that id): rljax scores each row where ``AutoModelForSequenceClassification`` pools, its
  last token that is not the padding id (without a pad token: the one before the EOS)."""
  from rljax.data import preferences, tokenizer as tokenizer_lib
  from rljax.train import reward_training
  tok_dir = hf_models.build_tokenizer(str(tmp_path / "tok"), pad=pad)
  tok = tokenizer_lib.load_tokenizer(tok_dir, chat_template=False)
  assert (tok.pad_id == tok.eos_id) == (not pad)
  path = hf_models.build_reward_model("llama", str(tmp_path / "rm"), seed=5, vocab=tok.vocab_size)
  cfg, params = models.load_hf(path, head="score")
  models.save_hf(str(tmp_path / "export"), cfg.replace(pad_token_id=tok.pad_id), params,
                 tokenizer=tok)  # as reward_training.initial_params and _export set it
  pairs = [preferences.Pair("what is 2 + 3?", "the answer is 5", "5"),
           preferences.Pair("12+7*3=", "33", "the answer is 12")]
  tokens, mask = reward_training.encode_pairs(tok, pairs, 40)
  tokens, mask = tokens.reshape(4, 40), mask.reshape(4, 40)
  assert (tokens[mask == 1][-1] == tok.eos_id) and (tokens[mask == 0] == tok.pad_id).all()
  cfg, params = models.load_hf(str(tmp_path / "export"), head="score")
  ours = np.asarray(_scores(cfg, params, tokens, mask))
  theirs = hf_models.hf_scores(str(tmp_path / "export"), tokens, mask)
  assert np.std(theirs) > 0.1 and np.abs(ours - theirs).max() <= 1e-4
  # By hand: the pooled token is the EOS with a pad token, the token before it without one, so
  # without one a row scores as the row with its EOS cut off.
  cut = np.concatenate([np.full((4, 1), tok.pad_id), tokens[:, :-1]], axis=1)
  cut_mask = np.concatenate([np.zeros((4, 1), mask.dtype), mask[:, :-1]], axis=1)
  cut_scores = np.asarray(_scores(cfg, params, cut, cut_mask))
  assert (np.abs(ours - cut_scores).max() <= 1e-4) == (not pad)


def test_a_gemma3_text_reward_model_exports_as_the_text_classifier(hf_dirs, rows, tmp_path):
  """A Gemma 3 text model's reward model is ``Gemma3TextForSequenceClassification``
  (``Gemma3ForSequenceClassification`` is the image-text model's): ``transformers`` loads the
  export as that class and scores alike."""
  import transformers
  cfg, lm = models.load_hf(hf_dirs["gemma3"])
  params = {k: v for k, v in lm.items() if k != "lm_head"}
  params["score"] = {"kernel": np.random.default_rng(0).normal(size=(cfg.hidden_size, 1))
                     .astype(np.float32)}
  models.save_hf(str(tmp_path), cfg, params)
  assert json.load(open(tmp_path / "config.json"))["architectures"] == [
      "Gemma3TextForSequenceClassification"]
  model = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path))
  assert type(model).__name__ == "Gemma3TextForSequenceClassification"
  tokens, mask = rows
  cfg, params = models.load_hf(str(tmp_path), head="score")
  ours = np.asarray(_scores(cfg, params, tokens, mask))
  assert np.abs(ours - hf_models.hf_scores(str(tmp_path), tokens, mask)).max() <= 1e-4

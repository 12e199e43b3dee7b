"""The reward model as a reward source: the policy's ids reused or the text re-encoded with the
reward model's own tokenizer, both scored as ``transformers`` scores them; one-line refusals; the
same scores on 8 simulated devices as on one."""
import dataclasses
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rljax.data.tokenizer import CharTokenizer, load_tokenizer
from rljax.config.table import get_config
from rljax.errors import ModelFileError, RunDirError, TokenizerError
from rljax.parallel import mesh as mesh_lib
from rljax.rewards import reward_model, sources
from rljax.loading import loader
from tests import hf_models
from tests.envs import chat_templates

PROMPTS = ["12+7=", "3*4=", "100-1=", "2+2="]
COMPLETIONS = ["19", "twelve 12", "99 #99", "4444444"]
ENDED = [True, True, True, False]  # the last row hit the token budget: no EOS


def policy_batch(tok, width_p=8, width_t=12):
  """The ``RewardBatch`` the loop hands a reward source: left-padded prompts, right-padded
  completions with EOS where they ended."""
  n = len(PROMPTS)
  prompt_tokens = np.full((n, width_p), tok.pad_id, np.int32)
  prompt_mask = np.zeros_like(prompt_tokens)
  tokens = np.full((n, width_t), tok.pad_id, np.int32)
  mask = np.zeros_like(tokens)
  for i, (p, c, ended) in enumerate(zip(PROMPTS, COMPLETIONS, ENDED)):
    ids = tok.encode_prompt(p)
    prompt_tokens[i, width_p - len(ids):], prompt_mask[i, width_p - len(ids):] = ids, 1
    out = (tok.encode(c) + [tok.eos_id])[:width_t] if ended else tok.encode(c)[:width_t]
    tokens[i, :len(out)], mask[i, :len(out)] = out, 1
  completions = [tok.decode(row[m.astype(bool)]) for row, m in zip(tokens, mask)]
  return sources.RewardBatch(prompts=PROMPTS, completions=completions, problems=[None] * n,
                             prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens,
                             mask=mask)


def rm_config(source, **rm):
  config = get_config()
  config.reward.model.source = source
  for key, value in rm.items():
    config.reward.model[key] = value
  return config


@pytest.fixture(scope="module")
def one_device():
  return mesh_lib.make_mesh(get_config().mesh)


@pytest.fixture(scope="module")
def char_rm(tmp_path_factory):
  """A Llama reward model over ids 0..96 (the char vocabulary fits), no tokenizer files."""
  return hf_models.build_reward_model("llama", str(tmp_path_factory.mktemp("rm") / "char"),
                                      seed=5)


@pytest.fixture(scope="module")
def bpe_rm(tmp_path_factory):
  """A Qwen2 reward model with its own byte-level BPE tokenizer (a Qwen-style one, ~400 ids;
  pad '<|endoftext|>' = 0) saved beside it."""
  path = str(tmp_path_factory.mktemp("rm") / "bpe")
  hf_models.build_reward_model("qwen2", path, seed=6, vocab=512)
  chat_templates.build_tokenizer("qwen2.5", path)
  return path


def test_the_policys_ids_are_scored_as_they_are(char_rm, one_device):
  tok = CharTokenizer()
  batch = policy_batch(tok)
  rm = loader.reward_model(rm_config(f"hf:{char_rm}", tokenizer="char"), tok,
                                      one_device)
  assert rm.reuse_ids
  scores = rm(batch)
  tokens = np.concatenate([batch.prompt_tokens, batch.tokens], 1)
  mask = np.concatenate([batch.prompt_mask, batch.mask], 1)
  theirs = hf_models.hf_scores(char_rm, tokens, mask)  # pools at the last non-pad (0) token
  assert scores.dtype == np.float32 and np.abs(scores - theirs).max() <= 1e-4


def test_another_tokenizer_re_encodes_the_text(bpe_rm, one_device):
  """The policy speaks char ids; the reward model scores the same text as its own tokenizer
  (``transformers.AutoTokenizer``) writes it: BOS-less Qwen ids of prompt and completion, EOS
  where the completion ended."""
  import transformers
  policy = CharTokenizer()
  batch = policy_batch(policy)
  rm = loader.reward_model(rm_config(f"hf:{bpe_rm}"), policy, one_device)
  assert not rm.reuse_ids
  scores = rm(batch)
  hf_tok = transformers.AutoTokenizer.from_pretrained(bpe_rm)
  rows = [hf_tok.encode(p, add_special_tokens=False) + hf_tok.encode(c, add_special_tokens=False)
          + ([hf_tok.eos_token_id] if ended else [])
          for p, c, ended in zip(PROMPTS, batch.completions, ENDED)]
  width = max(map(len, rows))
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, 1
  assert np.abs(scores - hf_models.hf_scores(bpe_rm, tokens, mask)).max() <= 1e-4


def test_a_causal_lm_is_refused_in_one_line(hf_dirs, one_device):
  with pytest.raises(ModelFileError, match=r"reward.model.source='hf:.*is not a sequence "
                                           r"classifier") as e:
    loader.reward_model(rm_config(f"hf:{hf_dirs['llama']}"), CharTokenizer(),
                                   one_device)
  assert "\n" not in str(e.value)


def test_tokenizer_mismatches_that_cannot_be_bridged(char_rm, bpe_rm, one_device):
  with pytest.raises(TokenizerError, match="holds no tokenizer files; name the reward model's "
                                           "tokenizer in reward.model.tokenizer"):
    loader.reward_model(rm_config(f"hf:{char_rm}"), CharTokenizer(), one_device)
  with pytest.raises(TokenizerError, match=r"its tokenizer has \d+ ids, more than the model's "
                                           "vocabulary of 97"):
    loader.reward_model(rm_config(f"hf:{char_rm}", tokenizer=bpe_rm),
                                   CharTokenizer(), one_device)
  # The policy writes what the char tokenizer cannot encode (upper case): named, one line.
  policy = load_tokenizer(bpe_rm)
  rm = loader.reward_model(rm_config(f"hf:{char_rm}", tokenizer="char"), policy,
                                      one_device)
  batch = dataclasses.replace(policy_batch(CharTokenizer()),
                              completions=["19", "Twelve", "99", "4"])
  with pytest.raises(TokenizerError, match="its tokenizer cannot encode row 1 .*'T'"):
    rm(batch)


def test_nan_scores_stop_the_step_naming_the_rows(char_rm, one_device, tmp_path):
  """A NaN in the embedding (of the token '9'): the one-hot embedding matmul spreads it to every
  row; the check names the count and the first row."""
  path = tmp_path / "nan"
  path.mkdir()
  tensors = load_file(os.path.join(char_rm, "model.safetensors"))
  tensors["model.embed_tokens.weight"][CharTokenizer().encode("9")[0]] = np.nan
  save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
  (path / "config.json").write_text(open(os.path.join(char_rm, "config.json")).read())
  rm = loader.reward_model(rm_config(f"hf:{path}", tokenizer="char"),
                                      CharTokenizer(), one_device)
  with pytest.raises(reward_model.RewardModelError,
                     match=r"scored 4 of 4 rows NaN or infinite \(first row 0\); the step "
                           "stopped before its update"):
    rm(policy_batch(CharTokenizer()))
  with pytest.raises(reward_model.RewardModelError, match=r"scored 2 of 5 rows .*first row 1\)"):
    reward_model.check_finite(np.array([0.0, np.nan, 1.0, np.inf, 2.0], np.float32), "x")
  reward_model.check_finite(np.array([0.0, -3.0], np.float32), "x")  # finite: nothing raised


def test_a_run_source_is_a_run_directory(tmp_path):
  with pytest.raises(RunDirError, match=r"is not an rljax run directory \(no config.json\)"):
    loader.load(rm_config(f"run:{tmp_path}@7"), "reward_model", CharTokenizer())


def test_composed_as_the_source_rm(char_rm):
  """``reward.sources='verifier:0,rm:2'``: the reward is twice the model's scores, logged raw as
  reward/rm; the source is built with no mesh (one device), as an evaluation builds it."""
  config = rm_config(f"hf:{char_rm}", tokenizer="char")
  config.reward.sources = "verifier:0,rm:2"
  tok = CharTokenizer()
  batch = policy_batch(tok)
  direct = loader.reward_model(config, tok, mesh_lib.make_mesh(config.mesh))(batch)
  reward = sources.make_reward(config, tok, None, None, task="verifier",
                               load=lambda role: loader.load(config, role, tok))
  verdicts = sources.Scored(np.zeros(4, np.float32), correct=np.zeros(4, bool))
  reward = dataclasses.replace(reward, terms=tuple(
      dataclasses.replace(t, source=lambda b: verdicts) if t.name == "verifier" else t
      for t in reward.terms))  # no verifier processes: the problems are not the point here
  composed = reward(batch)
  np.testing.assert_allclose(composed.values["rm"], direct, rtol=1e-6)
  np.testing.assert_allclose(composed.rewards, 2 * direct, rtol=1e-6)


def test_config_keys_are_read_only_with_the_source_rm():
  from rljax.config import checks as config_checks
  from rljax.errors import ConfigError
  config = get_config()
  config.reward.sources = "verifier:1,rm:0.5"
  with pytest.raises(ConfigError, match="names 'rm': set reward.model.source"):
    config_checks.check_config(config)
  config = get_config()
  config.reward.model.tokenizer = "char"
  with pytest.raises(ConfigError, match=r"reward.model.tokenizer='char' is not used: "
                                        r"reward.sources='' does not read it; it is read by "
                                        r"reward source 'rm'$"):
    config_checks.check_config(config)


def test_reward_model_dtype_is_its_compute_dtype(char_rm, one_device):
  """reward.model.dtype=bfloat16 (the default on accelerators, through model.dtype='auto'): the
  forward runs in bfloat16, close to float32's scores but not equal to them."""
  tok = CharTokenizer()
  batch = policy_batch(tok)
  full = loader.reward_model(rm_config(f"hf:{char_rm}", tokenizer="char"), tok,
                                        one_device)
  half = loader.reward_model(
      rm_config(f"hf:{char_rm}", tokenizer="char", dtype="bfloat16"), tok, one_device)
  assert (full.cfg.dtype, half.cfg.dtype) == ("float32", "bfloat16")
  diff = np.abs(half(batch) - full(batch))
  assert 0 < diff.max() < 0.1 * np.abs(full(batch)).max()


def test_rows_longer_than_the_reward_models_context_stop_the_step(char_rm, bpe_rm, one_device):
  """Was: a reward model of fewer positions than a row scored it silently (past its positions).
  With the policy's ids, row 1 is the longest: BOS, '3*4=', 'twelve 12' and EOS, 15 tokens;
  re-encoded by another tokenizer, whatever it makes of the text."""
  from rljax.errors import RewardSourceError
  policy = CharTokenizer()
  for path, tokenizer, named in ((char_rm, "char", r"row 1 is 15 tokens"), (bpe_rm, "", r"row \d")):
    rm = loader.reward_model(rm_config(f"hf:{path}", tokenizer=tokenizer), policy,
                                        one_device)
    rm.rows(policy_batch(policy))  # the model's own context holds them
    short = dataclasses.replace(rm, cfg=rm.cfg.replace(max_position_embeddings=10))
    with pytest.raises(RewardSourceError, match=named + r".* more than the reward model's "
                                                r"context of 10 positions"):
      short.rows(policy_batch(policy))


def test_a_lora_policys_reward_model_scores_without_adapters(char_rm, one_device):
  """Was: with ``model.lora.rank=4`` (a LoRA policy) the reward model took the policy's adapter
  settings and its placement failed (a pytree mismatch: kernels without lora_a / lora_b), so no
  LoRA run could score with ``reward.sources='rm:...'``. The frozen scorer has no adapters."""
  tok = CharTokenizer()
  config = rm_config(f"hf:{char_rm}", tokenizer="char")
  config.model.lora.rank = 4
  from rljax.loading import loader
  rm = loader.reward_model(config, tok, one_device)
  assert rm.cfg.lora_rank == 0
  batch = policy_batch(tok)
  tokens = np.concatenate([batch.prompt_tokens, batch.tokens], 1)
  mask = np.concatenate([batch.prompt_mask, batch.mask], 1)
  assert np.abs(rm(batch) - hf_models.hf_scores(char_rm, tokens, mask)).max() <= 1e-4

"""The LLM judge (``rljax.rewards.judge``): verdicts of a scripted engine parsed into the
hand-worked scores (unparsable ones counted, never raised), P(yes) against a NumPy softmax of a
tiny model's logits, and its keys refused in one line."""
import re

import jax
import numpy as np
import pytest

import rljax
from rljax.config import checks as config_checks
from rljax.data import tokenizer as tokenizer_lib
from rljax.data.tasks import Problem
from rljax.errors import ConfigError, RewardSourceError, StartupError
from rljax.loading import loader
from rljax.models import transformer
from rljax.rewards import judge as judge_lib
from rljax.rewards import sources
from rljax.rollout.engines import ROLLOUT_ENGINES, EngineBase, register_engine
from rljax.rollout.record import Rollout
from rljax.train import build
from tests import hf_models

VERDICTS = ["7", "score 3.5!", "no idea", "12", "-4 points", "ok 2 or 9"]
PROMPTS_SEEN = []


class ScriptedJudge(EngineBase):
  """Answers row i of every call with ``VERDICTS[i]`` (then EOS), recording the prompts."""

  def __init__(self, config, model_cfg, placement):
    super().__init__(model_cfg)
    self.tok = tokenizer_lib.load_tokenizer(config.data.tokenizer)

  def generate(self, tokens, mask, key, sampling, group_size):
    PROMPTS_SEEN.append([self.tok.decode(row[m > 0]) for row, m in zip(tokens, mask)])
    rows, t = len(tokens) * group_size, sampling.max_new_tokens
    out = np.full((rows, t), self.tok.pad_id, np.int32)
    lengths = np.zeros(rows, np.int32)
    for r in range(rows):
      ids = (self.tok.encode(VERDICTS[r]) + [self.tok.eos_id])[:t]
      out[r, :len(ids)], lengths[r] = ids, len(ids)
    zeros = np.zeros((rows, t), np.float32)
    return Rollout(prompt_tokens=tokens, prompt_mask=mask, tokens=out,
                   mask=(out != self.tok.pad_id).astype(np.int32), sampler_logp=zeros,
                   draw_logp=zeros, lengths=lengths, truncated=np.zeros(rows, bool))


@pytest.fixture
def scripted():
  register_engine("scripted_judge")(ScriptedJudge)
  PROMPTS_SEEN.clear()
  yield
  ROLLOUT_ENGINES.unregister("scripted_judge")


def _config(**judge):
  config = rljax.config()
  config.model.hidden_size, config.model.intermediate_size = 32, 64
  config.model.num_layers, config.model.num_heads, config.model.num_kv_heads = 1, 2, 1
  config.reward.sources = "verifier:1,judge:0.5"
  for key, value in judge.items():
    config.reward.judge[key] = value
  config_checks.check_config(config)
  return config


def _batch(completions):
  n = len(completions)
  problems = [Problem(prompt=f"{i}+1=", answer=str(i + 1)) for i in range(n)]
  ones = np.ones((n, 1), np.int32)
  return sources.RewardBatch(prompts=[p.prompt for p in problems], completions=completions,
                             problems=problems, prompt_tokens=ones, prompt_mask=ones,
                             tokens=ones, mask=ones)


def _judge(config):
  tok = tokenizer_lib.load_tokenizer("char")
  cfg = build.resolve_model_config(config, tok)
  model = loader.load(config, "judge", tok, policy_cfg=cfg)
  return sources.REWARD_SOURCES.get("judge")(config, tok, cfg, None, model), tok, cfg


def test_scripted_verdicts_parse_into_the_hand_worked_scores(scripted):
  config = _config(engine="scripted_judge", range=(0.0, 10.0), fallback=-1.0, max_new_tokens=12,
                   template="q {prompt} a {completion} score:")
  judge, _, _ = _judge(config)
  scored = judge(_batch(["1", "2", "3", "4", "5", "6"]))
  # "7" -> 7; "score 3.5!" -> 3.5; "no idea" -> the fallback -1 (counted); "12" -> clipped to 10;
  # "-4 points" -> clipped to 0; "ok 2 or 9" -> the first number, 2.
  np.testing.assert_array_equal(scored.values, np.float32([7, 3.5, -1, 10, 0, 2]))
  assert scored.metrics == {"reward/judge_unparsable": 1.0, "reward/judge_verdicts": 6.0}
  # The judge saw the template filled with each row (BOS dropped by decode).
  assert PROMPTS_SEEN == [[f"q {i}+1= a {i + 1} score:" for i in range(6)]]


def test_a_pattern_group_is_the_number_read():
  verdict = "step 1: fine. final: 8/10"
  assert judge_lib.parse_number(verdict, r"final: (\d+)", 0, 10) == 8.0
  assert judge_lib.parse_number(verdict, r"-?\d+(?:\.\d+)?", 0, 10) == 1.0
  assert judge_lib.parse_number("nan", r"\w+", 0, 10) is None


def test_p_yes_is_the_softmax_of_the_judges_next_token_logits():
  config = _config(parse="p_yes", yes="y", template="{prompt}{completion} ok?")
  judge, tok, cfg = _judge(config)
  completions = ["2", "7", "n"]
  scored = judge(_batch(completions))
  # The judge is the policy at step 0: the weights rljax.train.build loads for model.source.
  policy = build.load_policy(config, tok)[1]
  same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), judge.params,
                      policy)
  assert all(jax.tree.leaves(same))
  # The reference: the full forward of the unpadded prompts (all of one length), NumPy softmax of
  # the last position's logits. The judge left-pads them to data.prompt_bucket.
  ids = np.asarray([tok.encode_prompt(f"{i}+1={c} ok?") for i, c in enumerate(completions)])
  z = np.asarray(transformer.logits(cfg, policy, ids, np.ones_like(ids)), np.float64)[:, -1]
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(scored.values, p[:, tok.encode("y")[0]], rtol=1e-4)
  assert scored.values.dtype == np.float32 and ids.shape[1] < config.data.prompt_bucket


@pytest.mark.parametrize("judge, error, match", [
    ({"template": "{prompt} only"}, ConfigError, r"it names \['prompt'\]; expected exactly"),
    ({"template": "{prompt}{completion}{answer}"}, ConfigError, "expected exactly"),
    ({"pattern": "(unclosed"}, ConfigError, "not a regular expression"),
    ({"range": (5.0, 1.0)}, ConfigError, "lo < hi"),
])
def test_bad_judge_keys_are_refused_in_one_line(judge, error, match):
  with pytest.raises(error, match=match):
    _config(**judge)


def test_a_yes_of_several_tokens_and_an_unread_judge_key_are_refused():
  with pytest.raises(StartupError, match=r"reward.judge.yes=' yes' is 4 tokens"):
    _judge(_config(parse="p_yes"))
  config = rljax.config()
  config.reward.judge.parse = "p_yes"
  with pytest.raises(ConfigError, match=r"^reward.judge.parse='p_yes' is not used: reward.sources="
                                        r"'' does not read it; it is read by reward source "
                                        r"'judge'$"):
    config_checks.check_config(config)


def test_verdicts_none_of_which_parse_are_one_warning_and_counted(scripted, caplog):
  """Was: only counted in reward/judge_unparsable, never said. The first batch none of whose
  verdicts parses is one warning line (once per run); every batch is counted."""
  import logging
  config = _config(engine="scripted_judge", pattern=r"final: (\d+)", max_new_tokens=12)
  judge, _, _ = _judge(config)
  with caplog.at_level(logging.WARNING, logger=judge_lib.__name__):
    for _ in range(2):
      scored = judge(_batch(["1", "2", "3"]))
  assert scored.metrics == {"reward/judge_unparsable": 3.0, "reward/judge_verdicts": 3.0}
  np.testing.assert_array_equal(scored.values, np.zeros(3, np.float32))  # the fallback
  assert [r.getMessage() for r in caplog.records] == [
      "reward.judge: none of the 3 verdicts of a batch holds a number matching "
      "reward.judge.pattern='final: (\\\\d+)' (first: '7'); they score reward.judge.fallback=0. "
      "Counted in reward/judge_unparsable (per step); this is said once"]


def test_the_judges_context_holds_its_prompt_and_verdict(scripted):
  """Was: reward.judge.max_new_tokens=5000 ran past the judge's context of 4096 silently (1e8:
  an out-of-memory traceback), and so did prompts longer than the context leaves."""
  with pytest.raises(StartupError, match=re.escape(
      "reward.judge.max_new_tokens=5000 leaves no room for a prompt in the judge's context of "
      "4096 positions (max_position_embeddings of reward.judge.source='policy')")):
    _judge(_config(engine="scripted_judge", max_new_tokens=5000))
  judge, _, _ = _judge(_config(engine="scripted_judge", max_new_tokens=4000))
  # Row 1 by hand: BOS + "question: " 10 + "1+1=" 4 + "\nanswer: " 9 + 100 + "\nscore: " 8.
  with pytest.raises(RewardSourceError, match=re.escape(
      "reward.judge: the judge's prompt of row 1 is 132 tokens, more than the 96 its context of "
      "4096 positions leaves less reward.judge.max_new_tokens=4000")):
    judge(_batch(["1", "2" * 100, "3"]))


def test_a_lora_policys_judge_of_hugging_face_weights_has_no_adapters(tmp_path):
  """Was: ``model.lora.rank=4`` gave the judge of ``reward.judge.source='hf:...'`` the policy's
  adapter settings over weights that hold none (a traceback at its first forward). Its P(yes)
  is the softmax of ``transformers``' next-token logits of those weights."""
  tok = tokenizer_lib.load_tokenizer("char")
  path = hf_models.build("llama", str(tmp_path / "judge"), eos_token_id=tok.eos_id,
                         pad_token_id=tok.pad_id, num_hidden_layers=1)
  config = _config(parse="p_yes", yes="y", template="{prompt}{completion} ok?",
                   source=f"hf:{path}")
  config.model.lora.rank = 4
  judge, _, _ = _judge(config)
  assert judge.cfg.lora_rank == 0
  completions = ["2", "7", "n"]
  scored = judge(_batch(completions))
  ids = np.asarray([tok.encode_prompt(f"{i}+1={c} ok?") for i, c in enumerate(completions)])
  z = hf_models.hf_logits(path, ids, np.ones_like(ids))[:, -1]
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(scored.values, p[:, tok.encode("y")[0]], rtol=1e-4, atol=1e-6)

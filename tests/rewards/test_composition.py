"""The composed reward (``rljax.rewards.sources``): weights, whitening and clipping against
hand-worked numbers, a weight-0 source logged but adding nothing, bad sources refused in one
line, and the per-source metrics of a run."""
import types

import numpy as np
import pytest

import rljax

from rljax.config import checks as config_checks
from rljax.data import datasets
from rljax.data import tokenizer as tokenizer_lib
from rljax.data.tasks import Problem
from rljax.errors import ConfigError, RewardSourceError
from rljax.rewards import sources
from rljax.rollout.engines import Placement
from rljax.train import build, loop
from tests.train import tiny
from tests.train.test_custom_engine import CannedEngine

# Raw scores of the test sources for the four completions of ``_batch`` (rows in order).
RAW_A = [0.5, 2.0, -1.0, 0.25]
RAW_B = [1.0, 2.0, 3.0, 4.0]
SEEN = []  # batches the weight-0 source was called with


def _register():
  if "test_a" in sources.REWARD_SOURCES.names():
    return
  sources.register_reward_source("test_a")(lambda *cfg: lambda batch: np.asarray(RAW_A))
  sources.register_reward_source("test_b")(lambda *cfg: lambda batch: np.asarray(RAW_B))

  def logged_only(*cfg):
    def score(batch):
      SEEN.append(batch)
      return np.full(batch.size, 100.0)
    return score
  sources.register_reward_source("test_zero")(logged_only)
  # The completion's length in tokens: the mask's row sums.
  sources.register_reward_source("test_len")(lambda *cfg: lambda b: b.mask.sum(1))
  sources.register_reward_source("test_nan")(lambda *cfg: lambda b: np.array([0., np.nan, 0, 0]))
  sources.register_reward_source("test_shape")(lambda *cfg: lambda b: np.zeros((b.size, 2)))


_register()


def _config(**reward):
  config = rljax.config()
  config.reward.fn, config.reward.workers = tiny.REWARD, 1
  for key, value in reward.items():
    config.reward[key] = value
  config_checks.check_config(config)
  return config


def _batch():
  # tiny.REWARD: 1 when the characters' codes sum to a multiple of 4: only "4" (52).
  completions = ["4", "1", "2", "3"]
  problem = Problem(prompt="1+1=", answer="2")
  ones = np.ones((4, 2), np.int32)
  return sources.RewardBatch(prompts=[problem.prompt] * 4, completions=completions,
                             problems=[problem] * 4, prompt_tokens=ones, prompt_mask=ones,
                             tokens=ones, mask=ones)


def test_weighted_sum_of_whitened_and_clipped_sources_matches_the_hand_worked_values():
  config = _config(sources="verifier:1.0,test_a:0.5,test_b:-2,test_zero:0",
                   normalize="test_b:whiten", clip="test_a:0:1")
  reward = sources.make_reward(config, None, None)
  SEEN.clear()
  out = reward(_batch())
  # verifier [1, 0, 0, 0]; test_a clipped to [0, 1]: [0.5, 1, 0, 0.25], x 0.5;
  # test_b whitened: (x - 2.5) / sqrt(1.25) = [-1.341641, -0.447214, 0.447214, 1.341641], x -2;
  # test_zero: weight 0, nothing.
  np.testing.assert_allclose(out.rewards, [3.933282, 1.394427, -0.894427, -2.558282], atol=1e-5)
  assert out.rewards.dtype == np.float32
  np.testing.assert_array_equal(out.correct, [True, False, False, False])
  # Each source's raw scores, before normalisation and weighting (the weight-0 one included).
  extras = out.extras()
  np.testing.assert_array_equal(extras["reward/verifier"], [1, 0, 0, 0])
  np.testing.assert_array_equal(extras["reward/test_a"], RAW_A)
  np.testing.assert_array_equal(extras["reward/test_b"], RAW_B)
  np.testing.assert_array_equal(extras["reward/test_zero"], [100.0] * 4)
  assert len(SEEN) == 1 and list(SEEN[0].completions) == ["4", "1", "2", "3"]
  assert sources.source_means(extras)["reward/test_a"] == pytest.approx(np.mean(RAW_A))
  assert out.metrics == {"reward/timeouts": 0.0, "reward/errors": 0.0, "reward/invalid": 0.0}


def test_whiten_and_clip_match_numpy():
  x = np.random.default_rng(0).normal(3.0, 2.0, 64)
  expected = np.clip((x - x.mean()) / np.sqrt(x.var() + 1e-8), -1.0, 1.5)
  np.testing.assert_allclose(sources.normalize(x, whitened=True, clip=(-1.0, 1.5)), expected,
                             rtol=1e-6)
  assert sources.normalize(x, whitened=False, clip=None) is not None
  np.testing.assert_array_equal(sources.normalize(x, whitened=False, clip=None),
                                x.astype(np.float32))


def test_the_verifier_is_the_task_source_with_weight_0_when_not_named():
  reward = sources.make_reward(_config(sources="test_a:1"), None, None)
  assert [(t.name, t.weight) for t in reward.terms] == [("verifier", 0.0), ("test_a", 1.0)]
  out = reward(_batch())
  np.testing.assert_array_equal(out.rewards, np.float32(RAW_A))
  np.testing.assert_array_equal(out.correct, [True, False, False, False])
  # The default: the verifier alone, weight 1, its rewards exactly.
  default = sources.make_reward(_config(), None, None)
  assert [(t.name, t.weight) for t in default.terms] == [("verifier", 1.0)]
  np.testing.assert_array_equal(default(_batch()).rewards, [1, 0, 0, 0])


@pytest.mark.parametrize("name, match", [
    ("test_nan", r"reward source 'test_nan' returned nan at row 1 \(1 non-finite of 4\)"),
    ("test_shape", r"reward source 'test_shape' returned shape \(4, 2\) for a batch of 4 rows"),
])
def test_a_bad_source_answer_is_one_line_naming_the_source(name, match):
  reward = sources.make_reward(_config(sources=f"verifier:1,{name}:1"), None, None)
  with pytest.raises(RewardSourceError, match=match):
    reward(_batch())


@pytest.mark.parametrize("reward, match", [
    ({"sources": "verifier:1,nope:1"}, "'nope' is not a registered reward source; registered:"),
    ({"sources": "verifier:abc"}, "weight of 'verifier': 'abc' is not a number"),
    ({"sources": "verifier:nan"}, "weight of 'verifier': 'nan' is not finite"),
    ({"sources": "verifier:0"}, "every weight is 0"),
    ({"sources": "verifier:1", "normalize": "test_a:whiten"},
     "reward.normalize='test_a:whiten' names 'test_a', which is not a source of the reward"),
    ({"sources": "verifier:1", "clip": "test_a:0:1"},
     "reward.clip='test_a:0:1' names 'test_a', which is not a source of the reward"),
    ({"normalize": "verifier:rank"}, "the normalisation must be one of"),
    ({"clip": "verifier:1:0"}, "needs lo < hi"),
    ({"sources": "env:1"}, "names 'env': single-turn rollouts"),
])
def test_bad_composition_keys_are_refused_in_one_line(reward, match):
  with pytest.raises(ConfigError, match=match) as error:
    _config(**reward)
  assert "\n" not in str(error.value)


def test_a_step_logs_each_source_raw_and_optimises_their_weighted_sum():
  # The canned completions "1", "2", "3", "4" (+ EOS) of each group: the verifier scores
  # [0, 0, 0, 1], test_len 2 tokens each, test_zero 100 (weight 0: logged only).
  config = _config(sources="verifier:1,test_len:0.5,test_zero:0")
  config.rollout.prompts_per_step, config.rollout.group_size = 2, 4
  config.rollout.max_new_tokens, config.data.difficulty = 4, 0
  tok = tokenizer_lib.load_tokenizer("char")
  engine = CannedEngine(config, build.resolve_model_config(config, tok), Placement())
  engine.load_weights({}, 0)
  run = types.SimpleNamespace(
      config=config, source=datasets.make_prompt_source(config.data),
      generator=build.make_generator(config, engine, tok, None),
      algo=types.SimpleNamespace(transforms=()), state=types.SimpleNamespace(params=None),
      sampling=build.sampling_params(config, tok))
  batch, info = loop.collect_batch(run, 0)
  assert info["reward/verifier"] == pytest.approx(0.25)
  assert info["reward/test_len"] == pytest.approx(2.0)
  assert info["reward/test_zero"] == pytest.approx(100.0)
  np.testing.assert_allclose(batch.rewards, np.tile([1.0, 1.0, 1.0, 2.0], 2))
  assert info["reward_mean"] == pytest.approx(0.25 + 0.5 * 2.0)
  assert info["accuracy"] == pytest.approx(0.25)
  # The raw scores stay on the host: the batch sent to the devices has no extras of theirs.
  assert not any(k.startswith("reward/") for k in batch.extras)

"""A rollout engine written here, registered by name, trains through ``rljax train``: the seam of
``rljax.rollout.engines`` is all an engine needs (this file is the whole engine and its test)."""
import numpy as np
import pytest

from rljax import cli
from rljax.data import tokenizer as tokenizer_lib
from rljax.errors import RljaxError
from rljax.rollout.engines import EngineBase, ROLLOUT_ENGINES, register_engine
from rljax.rollout.record import Rollout
from tests.train import tiny

# Each group's 4 completions: the test reward (sum of the characters' codes % 4 == 0) holds for
# "4" alone (ord 52), so every group has a reward spread and the mean reward is exactly 1/4.
CANNED = ("1", "2", "3", "4")
CALLS = []  # ("generate", rows, group size, version) and ("load", version), in order


class CannedEngine(EngineBase):
  """Replays ``CANNED`` (completion i of a group is ``CANNED[i % 4]``, then EOS) for any prompt."""

  def __init__(self, config, model_cfg, placement):
    super().__init__(model_cfg)
    self.row_multiple = placement.row_multiple
    tok = tokenizer_lib.load_tokenizer(config.data.tokenizer)
    self.ids = [tok.encode(text) + [tok.eos_id] for text in CANNED]
    self.pad_id = tok.pad_id

  def load_weights(self, weights, version):
    super().load_weights(weights, version)
    CALLS.append(("load", version))

  def generate(self, tokens, mask, key, sampling, group_size):
    CALLS.append(("generate", len(tokens), group_size, self.version))
    rows, t = len(tokens) * group_size, sampling.max_new_tokens
    out = np.full((rows, t), self.pad_id, np.int32)
    lengths = np.zeros(rows, np.int32)
    for r in range(rows):
      ids = self.ids[r % len(self.ids)][:t]
      out[r, :len(ids)], lengths[r] = ids, len(ids)
    completion_mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    return Rollout(prompt_tokens=np.repeat(tokens, group_size, 0),
                   prompt_mask=np.repeat(mask, group_size, 0), tokens=out, mask=completion_mask,
                   sampler_logp=np.zeros((rows, t), np.float32),
                   draw_logp=np.zeros((rows, t), np.float32), lengths=lengths,
                   truncated=np.zeros(rows, bool))


@pytest.fixture
def canned():
  register_engine("canned_test")(CannedEngine)
  CALLS.clear()
  yield
  ROLLOUT_ENGINES.unregister("canned_test")


def test_a_registered_engine_trains_through_rljax_train(tmp_path, canned):
  result = cli.main(tiny.args("grpo", str(tmp_path / "run"), {"rollout.engine": "canned_test"}))
  # Every rollout came from the engine: the eval before training (4 problems greedy), 2 steps of
  # P = 2 prompts x G = 4, the eval after; step s's batch after the weights of step s were loaded.
  generated = [c[1:3] for c in CALLS if c[0] == "generate"]
  assert generated == [(4, 1), (2, 4), (2, 4), (4, 1)], CALLS
  steps = [c[3] for c in CALLS if c[0] == "generate" and c[2] == 4]
  assert steps == [0, 1], CALLS
  last = result["last"]
  assert last["reward_mean"] == pytest.approx(0.25)  # "4" in each group of 4
  assert last["len_mean"] == pytest.approx(2.0)  # one character and EOS
  # The greedy eval's 4 problems x 1 row are rows 0..3: "1", "2", "3", "4", one correct.
  assert result["eval_before"] == result["eval_after"] == pytest.approx(0.25)
  # The reward spread gave the policy a gradient: the update changed the weights.
  assert last["grad_norm"] > 0


def test_an_unregistered_engine_is_refused_by_name(tmp_path):
  with pytest.raises(RljaxError, match="rollout.engine='nope'"):
    cli.main(tiny.args("grpo", str(tmp_path / "run"), {"rollout.engine": "nope"}))


def test_fp8_weights_with_an_engine_that_does_not_apply_them_are_refused(tmp_path, canned):
  with pytest.raises(RljaxError, match="rollout.weight_dtype='float8_e4m3fn' is not applied by "
                                       "rollout.engine='canned_test'"):
    cli.main(tiny.args("grpo", str(tmp_path / "run"), {"rollout.engine": "canned_test",
                                                       "rollout.weight_dtype": "float8_e4m3fn"}))
  assert not [c for c in CALLS if c[0] == "generate"]  # refused before anything sampled

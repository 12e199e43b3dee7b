"""The SFT cold start is retrained exactly when something it depends on changes."""
import json
import os

import pytest

from rljax import config_loader
from rljax.train import sft

from . import tiny


def _stamp(tmp_path, **overrides):
  args = tiny.args("main", str(tmp_path), {k: str(v) for k, v in overrides.items()})
  path, parsed, _ = config_loader.split_config_args(args[1:])
  return sft.cold_start_stamp(config_loader.load_config(path, parsed))


@pytest.mark.parametrize("key,value", [("data.num_eval", 7), ("data.eval_seed", 5),
                                       ("train.steps", 9), ("rollout.temperature", 0.5)])
def test_eval_and_rl_keys_keep_the_cold_start(tmp_path, key, value):
  assert _stamp(tmp_path, **{key: value}) == _stamp(tmp_path)


@pytest.mark.parametrize("key,value", [("data.difficulty", 2), ("data.train_seed", 3),
                                       ("sft.steps", 11), ("model.hidden_size", 48), ("seed", 4)])
def test_training_keys_retrain_it(tmp_path, key, value):
  assert _stamp(tmp_path, **{key: value}) != _stamp(tmp_path)


def test_the_cold_start_directory_is_not_part_of_the_stamp(tmp_path, monkeypatch):
  # The sweep names cold starts by absolute paths, a user by relative ones; a moved study keeps
  # its cold starts.
  monkeypatch.chdir(tmp_path)
  assert _stamp(tmp_path, **{"sft.out_dir": "runs/sft"}) == \
      _stamp(tmp_path, **{"sft.out_dir": str(tmp_path / "runs" / "sft")})


def test_a_stamp_saved_with_its_directory_is_still_read_as_valid(tmp_path):
  want = _stamp(tmp_path)
  saved = {**want, "sft": {**want["sft"], "out_dir": "/somewhere/else"}}
  (tmp_path / sft.STAMP_FILE).write_text(json.dumps(saved))
  assert sft.read_stamp(str(tmp_path)) == want
  assert sft.read_stamp(str(tmp_path / "missing")) is None


def test_a_multi_turn_cold_start_saved_before_observations_were_masked_is_retrained():
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "tool_calc.py"), [])
  stamp = sft.cold_start_stamp(config)
  saved_before = {k: v for k, v in stamp.items() if k != "observations"}
  assert stamp != saved_before and stamp["observations"] == "unlearned"


def test_a_run_whose_cold_start_is_not_trained_yet_passes_the_start_up_checks(tmp_path):
  # The checks run before the cold start is trained; its architecture is then the tiny model of
  # the model keys (they used to look for its files and refuse every run from a clean runs/).
  from rljax.data import tokenizer as tokenizer_lib
  from rljax.train import build
  config = config_loader.load_config(
      os.path.join(tiny.ROOT, "configs", "tool_calc.py"),
      [("sft.out_dir", str(tmp_path / "sft")), ("train.run_dir", str(tmp_path / "run"))])
  build.prepare(config)
  model_cfg = build.resolve_model_config(config, tokenizer_lib.load_tokenizer("char"))
  assert (model_cfg.hidden_size, model_cfg.num_layers) == (config.model.hidden_size,
                                                           config.model.num_layers)

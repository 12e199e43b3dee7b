"""The SFT cold start is retrained exactly when something it depends on changes."""
import json
import os

import pytest

from rljax.errors import StartupError
from rljax.config import loader as config_loader
from rljax.data import tokenizer as tokenizer_lib
from rljax.train import build, sft

from . import tiny


def _stamp(tmp_path, **overrides):
  args = tiny.args("main", str(tmp_path), {k: str(v) for k, v in overrides.items()})
  path, parsed, _ = config_loader.split_config_args(args[1:])
  return sft.cold_start_stamp(config_loader.load_config(path, parsed))


@pytest.mark.parametrize("key,value", [("data.num_eval", 7), ("data.eval_seed", 5),
                                       ("train.steps", 9), ("rollout.temperature", 0.5),
                                       ("seed", 4), ("data.train_seed", 3)])
def test_eval_and_rl_keys_and_the_run_seeds_keep_the_cold_start(tmp_path, key, value):
  # The seeds of a study are RL runs from one cold start; sft.seed chooses it.
  assert _stamp(tmp_path, **{key: value}) == _stamp(tmp_path)


@pytest.mark.parametrize("key,value", [("data.difficulty", 2), ("sft.steps", 11),
                                       ("model.hidden_size", 48), ("sft.seed", 4)])
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
  config = config_loader.load_config(
      os.path.join(tiny.ROOT, "configs", "tasks", "tool_calc.py"), [])
  stamp = sft.cold_start_stamp(config)
  saved_before = {k: v for k, v in stamp.items() if k != "observations"}
  assert stamp != saved_before and stamp["observations"] == "unlearned"


def test_a_run_whose_cold_start_is_not_trained_yet_passes_the_start_up_checks(tmp_path):
  # The checks run before the cold start is trained; its architecture is then the tiny model of
  # the model keys (they used to look for its files and refuse every run from a clean runs/).
  from rljax.data import tokenizer as tokenizer_lib
  from rljax.train import build
  config = config_loader.load_config(
      os.path.join(tiny.ROOT, "configs", "tasks", "tool_calc.py"),
      [("sft.out_dir", str(tmp_path / "sft")), ("train.run_dir", str(tmp_path / "run"))])
  build.prepare(config)
  model_cfg = build.resolve_model_config(config, tokenizer_lib.load_tokenizer("char"))
  assert (model_cfg.hidden_size, model_cfg.num_layers) == (config.model.hidden_size,
                                                           config.model.num_layers)


def _config(tmp_path, **overrides):
  extra = {"sft.out_dir": str(tmp_path / "sft"), **{k: str(v) for k, v in overrides.items()}}
  args = tiny.args("main", str(tmp_path / "run"), extra)
  path, parsed, _ = config_loader.split_config_args(args[1:])
  return config_loader.load_config(path, parsed)


def _fake_training(monkeypatch):
  """``train_sft`` returning the random tiny model at once: these tests are about directories."""
  from rljax.models import transformer
  calls = []

  def train_sft(config, tokenizer, log=print):
    calls.append(config.sft.seed)
    cfg = build.resolve_model_config(config, tokenizer)
    return cfg, transformer.init_params(cfg, seed=config.sft.seed)
  monkeypatch.setattr(sft, "train_sft", train_sft)
  return calls


def _files(directory):
  return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def test_a_cold_start_of_other_settings_is_kept_and_the_new_one_goes_beside_it(tmp_path,
                                                                               monkeypatch):
  # Changing the cold start's seed used to retrain into sft.out_dir and delete the cold start
  # there, which another run (or a LoRA run's base) may load.
  calls = _fake_training(monkeypatch)
  tokenizer = tokenizer_lib.load_tokenizer("char")
  first = _config(tmp_path, **{"sft.seed": 0})
  assert sft.ensure_sft_checkpoint(first, tokenizer, log=lambda m: None) == str(tmp_path / "sft")
  kept = _files(tmp_path / "sft")
  logged = []
  second = _config(tmp_path, **{"sft.seed": 1})
  out = sft.ensure_sft_checkpoint(second, tokenizer, log=logged.append)
  assert out != str(tmp_path / "sft") and out.startswith(str(tmp_path / "sft") + "-")
  assert second.sft.out_dir == out  # what the run loads, exports from and records
  assert _files(tmp_path / "sft") == kept
  assert sft.read_stamp(out) == sft.cold_start_stamp(second)
  assert "sft.seed 0 -> 1" in logged[0] and "kept" in logged[0]
  # Back and forth: each cold start is found again, none trained twice.
  def cold_start(sft_seed):
    return sft.ensure_sft_checkpoint(_config(tmp_path, **{"sft.seed": sft_seed}), tokenizer,
                                     log=print)
  assert cold_start(0) == str(tmp_path / "sft")
  assert cold_start(1) == out
  assert calls == [0, 1]
  # A third setting gets its own directory.
  third = cold_start(2)
  assert len({str(tmp_path / "sft"), out, third}) == 3 and calls == [0, 1, 2]


def test_a_directory_of_other_files_is_still_refused(tmp_path, monkeypatch):
  _fake_training(monkeypatch)
  (tmp_path / "sft").mkdir()
  (tmp_path / "sft" / "notes.txt").write_text("mine")
  with pytest.raises(StartupError, match="not this config's SFT cold start"):
    sft.ensure_sft_checkpoint(_config(tmp_path), tokenizer_lib.load_tokenizer("char"))
  assert (tmp_path / "sft" / "notes.txt").read_text() == "mine"


def test_a_level_drawn_otherwise_under_the_same_number_retrains_the_cold_start(monkeypatch):
  # The stamp used to hold data.difficulty only: when level 0 of the visual task was renumbered
  # (the former level 0, random colours, became level 1) a cold start of the old level 0 was
  # still found valid. What defines the images is in the stamp now.
  import dataclasses
  from rljax.data import tasks
  from rljax.data.visual_tasks import VisualArithmetic
  config = config_loader.load_config(
      os.path.join(tiny.ROOT, "configs", "tasks", "visual.py"), [])
  before = sft.cold_start_stamp(config)
  level = VisualArithmetic.levels[0]
  for changed in (dataclasses.replace(level, random_look=True),  # the renamed level
                  dataclasses.replace(level, noise=level.noise + 1)):
    monkeypatch.setitem(VisualArithmetic.levels, 0, changed)
    tasks.make_task.cache_clear()
    after = sft.cold_start_stamp(config)
    assert after["data"] == before["data"] and after != before
  monkeypatch.setitem(VisualArithmetic.levels, 0, level)
  tasks.make_task.cache_clear()
  assert sft.cold_start_stamp(config) == before


def test_a_changed_drawing_with_the_same_level_parameters_retrains_it(monkeypatch):
  # Code that draws otherwise (here: inverted pixels) changes the problems' digest.
  from rljax.data import tasks, visual_tasks
  config = config_loader.load_config(
      os.path.join(tiny.ROOT, "configs", "tasks", "visual.py"), [])
  before = sft.cold_start_stamp(config)
  draw = visual_tasks.draw_text
  monkeypatch.setattr(visual_tasks, "draw_text", lambda text, rng, level: 255 - draw(text, rng,
                                                                                     level))
  tasks.make_task.cache_clear()
  after = sft.cold_start_stamp(config)
  tasks.make_task.cache_clear()
  assert after["task"]["level"] == before["task"]["level"] and after != before

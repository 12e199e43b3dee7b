"""model.source='run:DIR[@STEP]': a run's policy (and its frozen reference) starts from another
run's checkpoint, bit for bit; what cannot start is one line, before the run dir is claimed."""
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rljax import cli, plan
from rljax.config import loader as config_loader
from rljax.train import policy
from tests.train import tiny

GRPO = os.path.join(tiny.ROOT, "configs", "algos", "grpo.py")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  """A tiny GRPO run of 2 steps, checkpointed after each."""
  run_dir = str(tmp_path_factory.mktemp("first") / "run")
  cli.main(tiny.args("grpo", run_dir, {"train.checkpoint_every": "1"}))
  return run_dir


def _saved_params(run_dir: str, step: int) -> dict:
  """The policy arrays of checkpoint ``step`` as orbax wrote them (read without rljax)."""
  path = os.path.join(run_dir, "checkpoints", str(step), "state")
  with ocp.PyTreeCheckpointer() as reader:
    tree = reader.metadata(path).item_metadata.tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = reader.restore(path, restore_args=restore_args)
  return state["params"]


def _flat(tree) -> dict:
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_a_run_starts_from_another_runs_checkpoint_step(first_run, tmp_path):
  result = cli.main(tiny.args("grpo", str(tmp_path / "second"),
                              {"model.source": f"run:{first_run}@1", "train.steps": "1"}))
  saved = _flat(_saved_params(first_run, 1))
  latest = _flat(_saved_params(first_run, 2))
  reference = _flat(result["state"].ref_params)  # the frozen copy of the initial policy
  assert reference.keys() == saved.keys()
  for name, array in saved.items():
    assert reference[name].dtype == array.dtype and np.array_equal(reference[name], array), name
  assert any(not np.array_equal(saved[n], latest[n]) for n in saved)  # step 1, not the latest
  trained = _flat(result["state"].params)
  assert int(result["state"].step) == 1 and np.isfinite(result["last"]["loss"])
  assert any(not np.array_equal(trained[n], saved[n]) for n in saved)  # and it trained
  with open(os.path.join(tmp_path, "second", "config.json")) as f:
    assert json.load(f)["model"]["source"] == f"run:{first_run}@1"


def _fake_run(path, **data):
  """A directory holding only a tiny GRPO run's config.json (``data``: data.* changed)."""
  config = config_loader.load_config(GRPO, list(tiny.OVERRIDES.items()))
  with config.unlocked():
    config.data.update(data)
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(config.to_json_best_effort())
  return str(path)


@pytest.fixture
def nothing_is_loaded(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("weights were loaded before the start-up checks")
  monkeypatch.setattr(policy, "load_policy", refuse)


def _refusal(tmp_path, capsys, source: str, run_dir=None) -> str:
  run_dir = run_dir or str(tmp_path / "run")
  with pytest.raises(SystemExit) as info:
    cli.entry(tiny.args("grpo", run_dir, {"model.source": source}))
  err = capsys.readouterr().err
  assert info.value.code == 2, err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  assert not os.path.exists(os.path.join(run_dir, "config.json"))  # nothing claimed
  return err


def test_a_step_the_run_does_not_hold_names_the_ones_it_does(first_run, tmp_path, capsys,
                                                             nothing_is_loaded):
  err = _refusal(tmp_path, capsys, f"run:{first_run}@7")
  assert err == (f"error: model.source='run:{first_run}@7': '{first_run}' has no checkpoint of "
                 "step 7; its steps are [1, 2]\n")


def test_a_run_without_checkpoints_is_refused(tmp_path, capsys, nothing_is_loaded):
  run = _fake_run(tmp_path / "empty")
  err = _refusal(tmp_path, capsys, f"run:{run}")
  assert err.startswith(f"error: model.source='run:{run}': '{run}' holds no checkpoint"), err


def test_a_directory_that_is_no_run_is_refused(tmp_path, capsys, nothing_is_loaded):
  os.makedirs(tmp_path / "plain")
  err = _refusal(tmp_path, capsys, f"run:{tmp_path / 'plain'}")
  assert err == f"error: '{tmp_path / 'plain'}' is not an rljax run directory (no config.json)\n"


def test_a_run_of_another_tokenizer_is_refused(tmp_path, capsys, nothing_is_loaded):
  run = _fake_run(tmp_path / "other", tokenizer="/models/qwen")
  err = _refusal(tmp_path, capsys, f"run:{run}")
  assert err == (f"error: model.source='run:{run}': the run was trained with "
                 "data.tokenizer='/models/qwen' (its config.json), this config has "
                 "data.tokenizer='char'; drop that override or pass "
                 "--config.data.tokenizer=/models/qwen\n")


def test_the_runs_own_run_dir_is_refused(tmp_path, capsys, nothing_is_loaded):
  own = str(tmp_path / "run")
  err = _refusal(tmp_path, capsys, f"run:{own}/", run_dir=own)
  assert err.startswith(f"error: model.source='run:{own}/' is this run's own train.run_dir"), err


def test_tiny_sizes_are_refused_with_a_run_source(tmp_path, capsys, nothing_is_loaded):
  run = _fake_run(tmp_path / "src")
  argv = tiny.args("grpo", str(tmp_path / "run"), {"model.source": f"run:{run}"})
  with pytest.raises(SystemExit) as info:
    cli.entry(argv + ["--config.model.num_layers=3"])
  err = capsys.readouterr().err
  assert info.value.code == 2 and "model.num_layers" in err, err
  assert f"model.source='run:{run}' brings its own architecture" in err, err


def test_plan_takes_the_architecture_of_the_run(first_run):
  config = config_loader.load_config(GRPO, [("model.source", f"run:{first_run}")])
  name, cfg = plan.model_config(config)
  sizes = {k.split(".")[1]: int(tiny.OVERRIDES[k]) for k in tiny.MODEL_SIZES}
  assert name == f"run:{first_run}"
  assert {k: getattr(cfg, k) for k in sizes} == sizes  # the first run's, not the defaults
  assert cfg.vocab_size == 57 and cfg.dtype == "float32"  # the char tokenizer's vocabulary

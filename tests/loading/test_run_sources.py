"""What reading another run or an adapter must not get wrong (issue 58): a LoRA run on 'run:DIR'
keeps the base it started from after DIR trains further; an `rljax rm` run where a policy run
is read is one line; a PEFT adapter of NaN / inf / huge values is refused naming it, and its
lora_dropout is not dropped without a word."""
import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from rljax import cli, models
from rljax.errors import ModelFileError, RunDirError
from rljax.loading import loader, pin
from rljax.models import lora, peft, transformer
from tests.loading import runs
from tests.train import tiny

LORA = {"model.lora.rank": "2", "model.lora.alpha": "4.0"}


@pytest.fixture(scope="module")
def lora_on_run(tmp_path_factory):
  """A LoRA run of one step on 'run:A' (A: a policy run with checkpoint 1), exporting its merged
  weights; then A trains further (checkpoint 2, other weights)."""
  root = tmp_path_factory.mktemp("pin")
  base_run, lora_run = str(root / "a"), str(root / "b")
  saved = runs.policy_run(base_run, steps=(1,))
  cli.main(tiny.args("grpo", lora_run, {"model.source": f"run:{base_run}", **LORA,
                                        "train.steps": "1", "train.export_hf": "true"}))
  runs.policy_run(base_run, steps=(2,), seed=40)  # A trains further
  return base_run, lora_run, saved


def test_a_lora_run_pins_its_run_base_at_start(lora_on_run):
  base_run, lora_run, saved = lora_on_run
  with open(os.path.join(lora_run, pin.RECORD_FILE)) as f:
    record = json.load(f)
  assert record["source"] == f"run:{base_run}" and record["step"] == 1
  assert record["fingerprint"] == pin.fingerprint(lora.split_adapters(saved[1])[0])


def test_convert_and_run_sources_use_the_pinned_base_after_it_trained_further(lora_on_run,
                                                                              tmp_path):
  """The run's own export (written at its end, on the base of step 1) and a convert after the
  base run wrote step 2 give the same merged weights; so does reading 'run:B'."""
  _, lora_run, _ = lora_on_run
  _, exported = models.load_hf(os.path.join(lora_run, "hf"))
  cli.main(["convert", lora_run, str(tmp_path / "merged"), "--format", "merged"])
  _, converted = models.load_hf(str(tmp_path / "merged"))
  assert runs.same(converted, exported)
  read = loader.load(runs.config({"model.source": f"run:{lora_run}"}), "reference",
                     runs.TOKENIZER)
  assert runs.same(read.params, exported)


def test_a_replaced_base_checkpoint_is_refused(tmp_path):
  """The pinned step's weights are checked against the fingerprint: a base run whose checkpoint
  was rewritten with other weights is refused, not merged."""
  base_run, lora_run = str(tmp_path / "a"), str(tmp_path / "b")
  saved = runs.policy_run(base_run, steps=(1,))
  settings = runs.config(dict(LORA, **{"model.source": f"run:{base_run}"}))
  record = pin.base_record(settings, 1, lora.split_adapters(saved[1])[0])
  runs.policy_run(lora_run, steps=(1,), extra=dict(LORA, **{"model.source": f"run:{base_run}"}),
                  lora_base=record)
  reader = runs.config({"model.source": f"run:{lora_run}"})
  loader.load(reader, "reference", runs.TOKENIZER)  # the pinned base as it was: read
  shutil.rmtree(os.path.join(base_run, "checkpoints", "1"))
  runs.policy_run(base_run, steps=(1,), seed=77)  # step 1 rewritten with other weights
  with pytest.raises(RunDirError, match=r"at step 1 is not the one they were trained on \(its "
                                        r"weights' fingerprint differs\)"):
    loader.load(reader, "reference", runs.TOKENIZER)


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("rm") / "rm")
  runs.rm_run(path)
  return path


@pytest.mark.parametrize("argv", [
    lambda rm, out: ["convert", rm, out],
    lambda rm, out: ["eval", "--config", tiny.config_path("grpo"), "--checkpoint", rm],
    lambda rm, out: ["train", "--config", tiny.config_path("grpo"), f"--config.model.source=run:{rm}",
                     f"--config.train.run_dir={out}"],
], ids=["convert", "eval", "run_source"])
def test_a_reward_model_run_where_a_policy_run_is_read_is_one_line(rm_run, argv, tmp_path,
                                                                  capsys):
  with pytest.raises(SystemExit) as info:
    cli.entry(argv(rm_run, str(tmp_path / "out")))
  err = capsys.readouterr().err
  assert info.value.code == 2 and err.count("\n") == 1, err
  assert f"{rm_run!r} is an `rljax rm` run (a reward model, no language model head)" in err


def _adapter(path: str, value: float | None = None, dropout: float = 0.0) -> str:
  """A PEFT adapter of the tiny LoRA policy; ``value``: written into one factor."""
  cfg = loader.architecture(runs.config(LORA), "policy", runs.TOKENIZER)
  adapters = jax.tree.map(np.array, lora.split_adapters(transformer.init_params(cfg, seed=1))[1])
  if value is not None:
    leaf = jax.tree.leaves(adapters)[0]
    leaf.reshape(-1)[0] = value
  peft.save_peft_adapter(path, cfg, adapters, base_model=None)
  config_file = os.path.join(path, peft.CONFIG_FILE)
  with open(config_file) as f:
    settings = json.load(f)
  settings["lora_dropout"] = dropout
  with open(config_file, "w") as f:
    json.dump(settings, f)
  return path


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e30])
def test_an_adapter_of_non_finite_or_huge_values_is_refused_naming_it(tmp_path, value):
  path = _adapter(str(tmp_path / "adapter"), value)
  config = runs.config(dict(LORA, **{"model.lora.init_from": path}))
  with pytest.raises(ModelFileError, match=f"model.lora.init_from='{path}': the adapter's factor "
                                           r".* holds NaN, infinite or huge values") as e:
    loader.policy(config, runs.TOKENIZER)
  assert "\n" not in str(e.value)


def test_an_adapters_lora_dropout_is_not_dropped_silently(tmp_path, caplog):
  path = _adapter(str(tmp_path / "adapter"), dropout=0.1)
  config = runs.config(dict(LORA, **{"model.lora.init_from": path}))
  with caplog.at_level(logging.WARNING, logger="rljax.loading.loader"):
    cfg, params = loader.policy(config, runs.TOKENIZER)
  warned = [r.getMessage() for r in caplog.records if "lora_dropout" in r.getMessage()]
  assert len(warned) == 1 and "lora_dropout=0.1 is not applied" in warned[0]
  assert path in warned[0] and "\n" not in warned[0]
  theirs = peft.load_peft_adapter(path, cfg)  # and the factors are the adapter's own
  assert runs.same(lora.split_adapters(params)[1], theirs)


def test_adapters_of_a_lora_run_are_a_source_too(lora_on_run):
  """model.lora.init_from='run:DIR': the adapters of that LoRA run's checkpoint."""
  _, lora_run, _ = lora_on_run
  config = runs.config(dict(LORA, **{"model.lora.init_from": f"run:{lora_run}"}))
  _, params = loader.policy(config, runs.TOKENIZER)
  _, adapters = loader.read_run(loader.adapter_source(f"run:{lora_run}"), merged=False)
  assert runs.same(lora.split_adapters(params)[1], adapters)

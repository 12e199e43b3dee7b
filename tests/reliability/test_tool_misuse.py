"""The tools refuse what would silently mislead: eval with another tokenizer than the run's,
check-conversion on weights that give non-finite logits, convert over files it did not write."""
import json
import os

import numpy as np
import pytest

from rljax import cli, models
from rljax.config import loader as config_loader
from rljax.models import transformer
from tests.train import tiny

BASE = os.path.join(tiny.ROOT, "configs", "base.py")


def _fake_run(path, **overrides):
  """A run directory's config.json as ``train`` writes it (no checkpoint needed: the check
  comes before anything is loaded)."""
  config = config_loader.load_config(BASE, list(overrides.items()))
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  return str(path)


def test_eval_with_another_tokenizer_than_the_run_is_refused(tmp_path, capsys):
  run = _fake_run(tmp_path / "run")
  with pytest.raises(SystemExit) as info:
    cli.entry(["eval", "--config", BASE, f"--config.data.tokenizer={tmp_path}",
               "--checkpoint", run])
  assert info.value.code == 2
  assert capsys.readouterr().err == (
      f"error: eval --checkpoint {run}: the run was trained with data.tokenizer='char' (its "
      f"config.json), this config has data.tokenizer='{tmp_path}'; drop that override or pass "
      "--config.data.tokenizer=char\n")


def test_convert_refuses_a_non_empty_target(tmp_path, capsys):
  run = _fake_run(tmp_path / "run")
  out = tmp_path / "export"
  out.mkdir()
  (out / "model.safetensors").write_bytes(b"the user's own weights")
  with pytest.raises(SystemExit) as info:
    cli.entry(["convert", run, str(out)])
  assert info.value.code == 2
  assert capsys.readouterr().err.startswith(
      f"error: convert: the output '{out}' is not empty (it holds ['model.safetensors']...); name "
      "a new or empty directory, or pass --force")
  assert (out / "model.safetensors").read_bytes() == b"the user's own weights"
  from rljax.runs import run_dir
  run_dir.check_convert_target(run, str(out), force=True)  # --force lets it through
  run_dir.check_convert_target(run, str(tmp_path / "new"))
  (tmp_path / "empty").mkdir()
  run_dir.check_convert_target(run, str(tmp_path / "empty"))


def test_check_conversion_exits_non_zero_on_a_nan_logit(tmp_path, capsys):
  pytest.importorskip("torch")  # the command itself needs it; test_cli covers its absence
  config = config_loader.load_config(BASE, [(k, v) for k, v in tiny.OVERRIDES.items()
                                            if k.startswith("model.")])
  cfg = models.tiny_config(config.model, 57, eos_token_id=1, pad_token_id=0)
  params = transformer.init_params(cfg, seed=0)
  embed = np.array(params["embed_tokens"])
  embed[:, 3] = np.nan  # every token's embedding: every logit is NaN
  params["embed_tokens"] = embed
  models.save_hf(str(tmp_path / "nan"), cfg, params)
  with pytest.raises(SystemExit) as info:
    cli.entry(["check-conversion", str(tmp_path / "nan")])
  assert info.value.code == 2
  captured = capsys.readouterr()
  assert "max abs logit diff: nan" in captured.out  # still shown, but no longer a pass
  last = captured.err.splitlines()[-1]  # transformers' progress bars come before it
  assert last.startswith(f"error: check-conversion {tmp_path / 'nan'}: ")
  assert "logits are NaN or infinite" in last


@pytest.mark.parametrize("argv,line", [
    (["eval", "--config", BASE, "--config.reward.fn=nope"],
     "error: reward.fn='nope' is not allowed: expected a registered reward_fn name: "),
    (["eval", "--config", BASE, "--checkpoint", "/no/such"],
     "error: '/no/such' is not an rljax run directory (no config.json)"),
    (["convert", "/no/such", "{tmp}/out"],
     "error: '/no/such' is not an rljax run directory (no config.json)"),
], ids=["eval-reward-fn", "eval-not-a-run", "convert-not-a-run"])
def test_tool_misuse_is_one_line_exit_2(argv, line, tmp_path, capsys):
  with pytest.raises(SystemExit) as info:
    cli.entry([a.format(tmp=tmp_path) for a in argv])
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(line) and err.count("\n") == 1

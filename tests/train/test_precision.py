"""``model.matmul_precision``: the precision every entry point traces its functions under."""
import jax
import ml_collections
import pytest

from rljax.config import loader as config_loader
from rljax import models
from rljax.train import build, evaluation, loop, sft

from . import tiny


class _Seen(Exception):
  pass


def _config(precision: str, tmp_path):
  args = tiny.args("grpo", str(tmp_path / "run"), {"model.matmul_precision": precision})
  path, overrides, _ = config_loader.split_config_args(args[1:])
  return config_loader.load_config(path, overrides)


def _record(monkeypatch, module, name, seen):
  def fake(*args, **kwargs):
    seen.append(jax.config.jax_default_matmul_precision)
    raise _Seen
  monkeypatch.setattr(module, name, fake)


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_train_sft_and_eval_trace_under_the_configured_precision(monkeypatch, tmp_path, precision):
  config = _config(precision, tmp_path)
  before = jax.config.jax_default_matmul_precision  # e.g. set by JAX_DEFAULT_MATMUL_PRECISION
  seen = []
  _record(monkeypatch, build, "build_run", seen)
  _record(monkeypatch, sft, "train_sft", seen)
  _record(monkeypatch, evaluation, "_evaluate_config", seen)
  config.sft.out_dir = str(tmp_path / "sft")
  for entry in (lambda: loop.train(config), lambda: evaluation.evaluate_config(config),
                lambda: sft.ensure_sft_checkpoint(config, tokenizer=None, log=lambda _: None)):
    with pytest.raises(_Seen):
      entry()
  assert seen == [precision] * 3
  assert jax.config.jax_default_matmul_precision == before  # restored afterwards


def test_default_leaves_jax_setting_alone():
  with jax.default_matmul_precision("highest"):
    with models.matmul_precision(ml_collections.ConfigDict({"matmul_precision": "default"})):
      assert jax.config.jax_default_matmul_precision == "highest"


def test_unknown_precision_is_named(tmp_path):
  with pytest.raises(ValueError, match=r"model.matmul_precision='fast'.*'highest'"):
    loop.train(_config("fast", tmp_path))

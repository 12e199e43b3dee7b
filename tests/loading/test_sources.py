"""``rljax.config.sources``: every written form of a model source, parsed once for the policy,
the teacher and ``rljax.load``; a bad one is one line naming the key, the value and the forms."""

import pytest

from rljax.errors import StartupError
from rljax.config.sources import ModelSource, parse_source


@pytest.mark.parametrize("text, want", [
    ("tiny", ModelSource("tiny", text="tiny")),
    ("sft", ModelSource("sft", text="sft")),
    ("hf:/m/qwen", ModelSource("hf", "/m/qwen", text="hf:/m/qwen")),
    ("run:/runs/a", ModelSource("run", "/runs/a", text="run:/runs/a")),
    ("run:/runs/a@12", ModelSource("run", "/runs/a", 12, text="run:/runs/a@12")),
    # '@' not followed by digits belongs to the path
    ("run:/runs/x@y", ModelSource("run", "/runs/x@y", text="run:/runs/x@y")),
])
def test_each_form(text, want):
  assert parse_source(text) == want


@pytest.mark.parametrize("text", ["bogus", "hf:", "run:", "", "/a/path", "HF:/m"])
def test_bad_sources_name_the_key_and_the_forms(text):
  with pytest.raises(StartupError) as e:
    parse_source(text, "model.source", ("tiny", "sft", "hf"))
  assert str(e.value) == f"model.source must be 'tiny', 'sft' or 'hf:PATH', got {text!r}"


def test_a_kind_the_consumer_does_not_take_is_refused():
  with pytest.raises(StartupError, match=r"teacher.source must be 'hf:PATH', got 'tiny'"):
    parse_source("tiny", "teacher.source", ("hf",))


def test_bare_directories_are_run_or_hf_by_their_contents(tmp_path):
  run, hf = tmp_path / "run", tmp_path / "hf"
  (run / "checkpoints").mkdir(parents=True)
  hf.mkdir()
  assert parse_source(str(run), bare_paths=True) == ModelSource("run", str(run), text=str(run))
  assert parse_source(str(hf), bare_paths=True) == ModelSource("hf", str(hf), text=str(hf))
  with pytest.raises(StartupError, match="or a directory, got"):
    parse_source(str(tmp_path / "missing"), "rljax.load's source", bare_paths=True)
  with pytest.raises(StartupError):  # without bare_paths a directory is no source
    parse_source(str(hf))

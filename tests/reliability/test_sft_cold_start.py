"""The SFT cold start under real use: SIGTERM saves its step (one line) and the rerun continues
it to the uninterrupted cold start's weights; mistakes that used to stop it midway with a
traceback (examples wider than the sampler's window, an ``sft.out_dir`` that cannot be written)
are one line at start, before anything is written."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from rljax import cli, models
from tests.train import tiny

GRPO = os.path.join(tiny.ROOT, "configs", "algos", "grpo.py")
SFT = {"model.source": "sft", "sft.steps": "4", "sft.batch_size": "8", "sft.warmup_steps": "1",
       "rollout.max_new_tokens": "24"}


def sft_args(out_dir: str, **extra) -> list[str]:
  args = {**tiny.OVERRIDES, **SFT, "sft.out_dir": out_dir, **extra}
  return ["sft", "--config", GRPO] + [f"--config.{k}={v}" for k, v in args.items()]


@pytest.mark.slow
def test_sigterm_saves_the_cold_start_step_and_the_rerun_ends_as_the_uninterrupted_one(tmp_path):
  """Was: SIGTERM killed `rljax sft` (exit 143, no line) and the cold start was lost."""
  reference = cli.main(sft_args(str(tmp_path / "reference")))
  out = str(tmp_path / "cold")
  env = dict(os.environ, PYTHONPATH=tiny.ROOT)
  result = subprocess.run([sys.executable, "-m", "tests.reliability.killable", "term:sft:2"]
                          + sft_args(out), cwd=tiny.ROOT, env=env, capture_output=True, text=True,
                          timeout=600, start_new_session=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"preempted (SIGTERM) in the SFT cold start at step 2: checkpoint saved in {out}.partial; "
      "rerun the same command to continue it")
  assert not os.path.exists(out)
  assert cli.main(sft_args(out)) == out
  assert not os.path.exists(f"{out}.partial")  # removed once the cold start is published
  _, want = models.load_hf(reference)
  _, got = models.load_hf(out)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6,
                                                      atol=1e-6), got, want)


def _entry(args, capsys) -> str:
  with pytest.raises(SystemExit) as e:
    cli.entry(args)
  assert e.value.code == 2
  return capsys.readouterr().err


def test_examples_wider_than_the_window_are_one_line_before_anything_is_written(tmp_path, capsys):
  """Was: a ValueError traceback at the SFT batch holding the first such example (for `rljax
  train`: after the run dir was claimed)."""
  out = tmp_path / "sft"
  narrow = {"rollout.max_new_tokens": "8"}  # + data.prompt_bucket 8: a window of 16 tokens
  err = _entry(sft_args(str(out), **narrow), capsys)
  assert err.startswith("error: an SFT example of ") and err.count("\n") == 1
  assert ("is wider than the sampler's window of 16 (data.prompt_bucket + "
          "rollout.max_new_tokens)") in err
  assert not out.exists()
  run_dir = tmp_path / "run"
  err = _entry(tiny.args("grpo", str(run_dir), {**SFT, **narrow, "sft.out_dir": str(out)}), capsys)
  assert "is wider than the sampler's window of 16" in err and not run_dir.exists()


def test_an_out_dir_that_cannot_be_written_is_one_line_before_anything_is_written(tmp_path,
                                                                                  capsys):
  """Was: a NotADirectoryError traceback after the whole cold start had trained."""
  blocker = tmp_path / "file"
  blocker.write_text("")
  out = blocker / "sft"
  assert _entry(sft_args(str(out)), capsys) == (
      f"error: sft.out_dir={str(out)!r} cannot be created: {str(blocker)!r} is not a directory; "
      "choose another sft.out_dir\n")
  run_dir = tmp_path / "run"
  err = _entry(tiny.args("grpo", str(run_dir), dict(SFT, **{"sft.out_dir": str(out)})), capsys)
  assert "cannot be created" in err and not run_dir.exists()


def test_an_out_dir_that_is_a_file_is_refused_and_the_file_kept(tmp_path, capsys):
  """Was: the cold start trained, then the user's file was renamed to ``<name>.old-<ns>`` and a
  directory of weights took its place."""
  out = tmp_path / "notes.txt"
  out.write_text("mine")
  assert _entry(sft_args(str(out)), capsys) == (
      f"error: sft.out_dir={str(out)!r} exists and is not a directory; choose another "
      "sft.out_dir\n")
  assert out.read_text() == "mine" and os.listdir(tmp_path) == ["notes.txt"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_out_dir_where_no_directory_can_be_made_is_one_line(tmp_path, capsys):
  """Was: a FileNotFoundError traceback after the whole cold start had trained: ``os.access``
  says /proc may be written (for root), ``mkdir`` there fails. The check makes (and removes) a
  directory where the cold start will be written."""
  out = "/proc/rljax-sft"
  err = _entry(sft_args(out), capsys)
  assert err.startswith(f"error: sft.out_dir={out!r} cannot be created: '/proc' cannot be "
                        "written (") and err.count("\n") == 1
  assert err.endswith("); choose another sft.out_dir\n")
  run_dir = tmp_path / "run"
  err = _entry(tiny.args("grpo", str(run_dir), dict(SFT, **{"sft.out_dir": out})), capsys)
  assert "cannot be created" in err and not run_dir.exists()


def test_the_exact_match_checks_examples_are_checked_too(tmp_path, capsys):
  """Was: with ``sft.stop_match`` the examples of the exact-match check (their own stream of
  ``sft.check_size``) were not checked at start: one of them wider than the window stopped the
  cold start after ``rljax train`` had written its run dir. Here the training examples fit the
  window of 24 (lengths 24 and 22 by hand from the stream) and a check example is 26 tokens."""
  out, run_dir = tmp_path / "sft", tmp_path / "run"
  args = {**SFT, "sft.steps": "1", "sft.batch_size": "2", "sft.warmup_steps": "0",
          "sft.stop_match": "0.5", "rollout.max_new_tokens": "16", "sft.out_dir": str(out)}
  err = _entry(tiny.args("grpo", str(run_dir), args), capsys)
  assert err.startswith("error: an SFT example of 26 tokens (prompt, solution, EOS) is wider "
                        "than the sampler's window of 24") and err.count("\n") == 1, err
  assert not run_dir.exists() and not out.exists()

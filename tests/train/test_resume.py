"""A run killed after its first checkpoint resumes and replays the remaining steps exactly."""
import os

import pytest

from rljax import cli
from rljax.train import loop
from rljax.runs import run_dir
from rljax.runs import metrics as metrics_lib
from tests.train import tiny

EXTRA = {"train.steps": "4", "train.checkpoint_every": "2", "algo.minibatches": "2"}


def _records(run_dir):
  rows = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return [metrics_lib.without_timing(r) for r in rows]


class Killed(Exception):
  pass


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tmp_path, monkeypatch):
  full_dir = str(tmp_path / "full")
  cli.main(tiny.args("grpo", full_dir, EXTRA))

  killed_dir = str(tmp_path / "killed")
  real_collect = loop.collect_batch

  def collect_then_die(run, step, stream=0, **kwargs):
    if step == 2:  # after the step-2 checkpoint, during step 3
      raise Killed()
    return real_collect(run, step, stream, **kwargs)

  monkeypatch.setattr(loop, "collect_batch", collect_then_die)
  with pytest.raises(Killed):
    cli.main(tiny.args("grpo", killed_dir, EXTRA))
  monkeypatch.setattr(loop, "collect_batch", real_collect)

  # A fresh run refuses to overwrite the killed run's checkpoints ...
  with pytest.raises(run_dir.RunDirError, match="resume"):
    cli.main(tiny.args("grpo", killed_dir, EXTRA))
  # ... and --config.train.resume=True continues it.
  cli.main(tiny.args("grpo", killed_dir, dict(EXTRA, **{"train.resume": "true"})))

  # Every eval record (before training, and after it) carries its wall time, which the
  # comparison below leaves out with the other wall-clock metrics.
  evals = [r for r in metrics_lib.read_jsonl(os.path.join(full_dir, "metrics.jsonl"))
           if "eval_accuracy" in r]
  assert len(evals) >= 2 and all(r["sec_eval"] > 0 for r in evals)
  full, resumed = _records(full_dir), _records(killed_dir)
  assert [r["step"] for r in resumed] == [r["step"] for r in full]
  for a, b in zip(full, resumed):
    assert a.keys() == b.keys()
    for key in a:
      assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), (a["step"], key)

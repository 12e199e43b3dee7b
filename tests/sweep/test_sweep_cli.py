"""``python -m rljax sweep`` end to end on the smoke study (2 variants x 2 seeds x 2 steps of a
tiny model): outputs, seeds, resuming only what is missing (and reproducing it), re-aggregating
a finished study."""
import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

from rljax.sweep import sweep
from rljax.sweep.study import StudyError
from rljax.runs.metrics import read_jsonl, without_timing

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STUDY = os.path.join(HERE, "smoke_study.py")
RUNS = ["symmetric/seed0", "symmetric/seed1", "clip_higher/seed0", "clip_higher/seed1"]


def _sweep(root, *extra):
  """Run the CLI in a subprocess; returns its final JSON summary line."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "-m", "rljax", "sweep", STUDY, "--root", str(root),
                         *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _without_timings(records):
  return [without_timing(r) for r in records]


def _attempts(root, run):
  with open(os.path.join(root, "smoke", run, "sweep_wall.json")) as f:
    return len(json.load(f))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """The study run by two sweeps: seed 0's two runs one after the other (the first compiles into
  the session's compilation cache, the second loads it), then seed 1's two at once
  (``--parallel 2``), both loading it. Two parallel runs on a cold cache would both compile every
  program, each on one of the two cores."""
  root = tmp_path_factory.mktemp("studies")
  first = _sweep(root, "--seeds", "0")
  return root, first, _sweep(root, "--parallel", "2")


@pytest.mark.slow
def test_smoke_study_runs_end_to_end(finished):
  root, first, summary = finished
  assert sorted(first["ran"]) == sorted(r for r in RUNS if r.endswith("seed0"))
  assert sorted(summary["ran"]) == sorted(r for r in RUNS if r.endswith("seed1"))
  assert first["failed"] == summary["failed"] == []
  with open(summary["runs_csv"]) as f:
    runs = list(csv.DictReader(f))
  assert sorted(f"{r['variant']}/seed{r['seed']}" for r in runs) == sorted(RUNS)
  assert all(float(r["wall_time_s"]) > 0 for r in runs)
  with open(summary["summary_csv"]) as f:
    rows = list(csv.DictReader(f))
  assert {r["variant"] for r in rows} == {"symmetric", "clip_higher"}
  assert all(int(r["n"]) == 2 for r in rows if r["metric"] == "final_accuracy")
  text = open(summary["markdown"]).read()
  assert "| clip_higher | 2 |" in text and "Difference to `symmetric`, paired by seed" in text
  with open(summary["curves_png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert os.path.getsize(summary["curves_png"]) > 10_000


@pytest.mark.slow
def test_seed_changes_the_run_and_the_variant_not_the_first_rollout(finished):
  root, _, _ = finished

  def first_step(run):
    records = read_jsonl(os.path.join(root, "smoke", run, "metrics.jsonl"))
    return next((r["len_mean"], r["entropy"]) for r in records if r["step"] == 1)

  # Step 1 samples from the initial policy: it depends on the seed only, not on the clip range.
  assert first_step("symmetric/seed0") == first_step("clip_higher/seed0")
  assert first_step("symmetric/seed0") != first_step("symmetric/seed1")
  config = json.load(open(os.path.join(root, "smoke", "symmetric", "seed1", "config.json")))
  assert config["seed"] == 1 and config["data"]["train_seed"] == 1


@pytest.mark.slow
def test_resume_runs_only_what_is_missing_then_only_aggregates(finished, capsys):
  root, _, _ = finished
  metrics = os.path.join(root, "smoke", "clip_higher", "seed1", "metrics.jsonl")
  before = _without_timings(read_jsonl(metrics))
  shutil.rmtree(os.path.dirname(metrics))
  summary = _sweep(root)
  assert summary["ran"] == ["clip_higher/seed1"]
  # The same (variant, seed) reproduces its numbers.
  assert _without_timings(read_jsonl(metrics)) == before
  assert [_attempts(root, run) for run in RUNS] == [1, 1, 1, 1]
  again = sweep.main([STUDY, "--root", str(root)])  # in this process: nothing left to run
  assert again["ran"] == [] and os.path.isfile(again["markdown"])
  assert [_attempts(root, run) for run in RUNS] == [1, 1, 1, 1]
  # Nothing is missing: no command to print; a different config is refused, not mixed in.
  assert sweep.main([STUDY, "--root", str(root), "--print-commands"]) == {"commands": 0}
  with pytest.raises(StudyError, match="optim.lr"):
    sweep.main([STUDY, "--root", str(root), "--aggregate-only", "--set", "optim.lr=0.5"])


def test_print_commands_is_the_train_cli_one_line_per_run(tmp_path, capsys):
  assert sweep.main([STUDY, "--root", str(tmp_path), "--print-commands"]) == {"commands": 4}
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 4
  assert all(line.startswith("python -m rljax train --config ") for line in lines)
  assert "--config.seed=1 --config.data.train_seed=1" in lines[1]
  assert "--config.train.resume=True" not in lines[2]  # new runs; a started one resumes
  assert "--config.algo.clip_eps_high=0.28" in lines[3]


def test_seeds_option_restricts_the_study(tmp_path, capsys):
  assert sweep.main([STUDY, "--root", str(tmp_path), "--print-commands", "--seeds", "1"]) \
      == {"commands": 2}
  lines = capsys.readouterr().out.strip().splitlines()
  assert all("--config.seed=1 " in line for line in lines)
  with pytest.raises(StudyError, match=r"\[7\] are not seeds of study 'smoke'"):
    sweep.main([STUDY, "--root", str(tmp_path), "--print-commands", "--seeds", "0,7"])

"""W&B (offline) and MLflow (local file store) loggers: what a tiny run logs, read back from the
trackers' own stores; resume into the same tracker run; a failing tracker never stops a run."""
import base64
import dataclasses
import glob
import hashlib
import json
import logging
import math
import os
import struct

import pytest
import wandb  # installed by the test bootstrap (rljax[wandb])
from mlflow.tracking import MlflowClient  # installed by the test bootstrap (rljax[mlflow])
from wandb.proto import wandb_internal_pb2

from rljax import cli
from rljax.config import loader as config_loader
from rljax.errors import ConfigError, UnknownComponentError, UnusedKeyError
from rljax.errors import StartupError
from rljax.runs import trackers
from rljax.runs.metrics import MetricsWriter, eval_table, read_jsonl
from rljax.runs.run_dir import flatten_config
from tests.train import tiny

BASE = os.path.join(tiny.ROOT, "configs", "base.py")


# --- reading what the trackers stored, independently of the loggers ----------------------------

def wandb_offline_records(path: str):
  """The protobuf records of an offline W&B run file (``run-<id>.wandb``): a LevelDB-style log,
  a 7-byte header (':W&B', magic, version), then 32 KiB blocks of chunks, each with a 7-byte
  header (crc32, little-endian length, type: 1 full, 2 first, 3 middle, 4 last)."""
  block = 32768
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", path
  pos, chunks = 7, []
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # a block's tail too short for a header is padding
      pos += left
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if length == 0 and kind == 0:
      pos += left
      continue
    chunks.append(data[pos + 7:pos + 7 + length])
    pos += 7 + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(b"".join(chunks))
      chunks = []
      yield record


def wandb_offline_runs(run_dir: str) -> list[dict]:
  """Per offline W&B run under ``run_dir/wandb`` (in time order): its id, group, name, tags,
  config, history ``{step: {key: value}}`` and artifacts ``{file name: md5 base64}``."""
  runs = []
  for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))):
    run = {"history": {}, "config": {}, "artifacts": {}}
    for record in wandb_offline_records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run.update(id=record.run.run_id, group=record.run.run_group,
                   name=record.run.display_name, tags=list(record.run.tags),
                   project=record.run.project)
        run["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
      elif kind == "config":
        run["config"].update({u.key: json.loads(u.value_json) for u in record.config.update})
      elif kind == "history":
        # A key with '/' (data/invalid_rows) may be stored split, as nested_key.
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
               for item in record.history.item}
        run["history"].setdefault(int(row.pop("_step")), {}).update(row)
      elif kind == "artifact":
        run["artifacts"].update({c.path: c.digest for c in record.artifact.manifest.contents})
    runs.append(run)
  return runs


def md5_base64(path: str) -> str:
  with open(path, "rb") as f:
    return base64.b64encode(hashlib.md5(f.read()).digest()).decode()


def same(a, b) -> bool:
  """Equal floats, NaN equal to NaN (metrics.jsonl writes non-finite values as null)."""
  a = float("nan") if a is None else float(a)
  b = float("nan") if b is None else float(b)
  return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12)


def assert_holds_jsonl(run_dir: str, lookup) -> int:
  """Every (step, key, value) of ``metrics.jsonl`` is found by ``lookup(step, key) -> values``;
  returns how many were checked."""
  checked = 0
  for record in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
    for key, value in record.items():
      if key == "step":
        continue
      found = lookup(record["step"], key)
      assert any(same(value, v) for v in found), (record["step"], key, value, found)
      checked += 1
  return checked


# --- a tiny run with both trackers, then resumed --------------------------------------------------

def test_wandb_and_mlflow_hold_the_run_and_a_resume_continues_them(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's file store is opt-in
  store = f"file://{tmp_path / 'mlruns'}"
  run_dir = str(tmp_path / "run")
  extra = {"train.loggers": "('jsonl', 'tensorboard', 'wandb', 'mlflow')",
           "train.mlflow_tracking_uri": store, "train.tracker_project": "tiny",
           "train.tracker_group": "study", "train.tracker_tags": "('ablation', 'grpo')",
           "train.eval_every": "1", "train.checkpoint_every": "1"}
  cli.main(tiny.args("grpo", run_dir, extra))
  with open(os.path.join(run_dir, "config.json")) as f:
    config = json.load(f)
  ids = trackers.read_ids(run_dir)

  # W&B: one offline run, named after the run dir, holding every metric, the config, artifacts.
  (first,) = wandb_offline_runs(run_dir)
  assert first["id"] == ids["wandb"] and first["project"] == "tiny"
  assert (first["group"], first["name"], first["tags"]) == ("study", "run", ["ablation", "grpo"])
  assert {k: v for k, v in first["config"].items() if k != "_wandb"} == config
  assert assert_holds_jsonl(run_dir, lambda s, k: [first["history"].get(s, {}).get(k)]) > 20
  for name in ("curves.png", "evals.csv"):
    assert first["artifacts"][name] == md5_base64(os.path.join(run_dir, name))

  # MLflow: one run in experiment 'tiny', tagged, every metric at its step, the config as params.
  client = MlflowClient(store)
  experiment = client.get_experiment_by_name("tiny")
  (run,) = client.search_runs([experiment.experiment_id])
  assert run.info.run_id == ids["mlflow"]["run_id"] and run.info.status == "FINISHED"
  assert run.data.tags["rljax.group"] == "study" and {"ablation", "grpo"} <= set(run.data.tags)
  params = {k: (v if isinstance(v, str) else json.dumps(v))
            for k, v in flatten_config(config).items()}
  params = {k: json.dumps(list(v)) if isinstance(v, tuple) else v for k, v in params.items()}
  assert run.data.params == params

  def mlflow_values(step, key):
    return [m.value for m in client.get_metric_history(run.info.run_id, trackers.mlflow_key(key))
            if m.step == step]
  assert assert_holds_jsonl(run_dir, mlflow_values) > 20
  downloaded = client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts"))
  for name in ("curves.png", "evals.csv"):
    assert md5_base64(os.path.join(downloaded, name)) == md5_base64(os.path.join(run_dir, name))
  with open(os.path.join(downloaded, "config.json")) as f:
    assert json.load(f) == config

  # Resume to step 4: the same W&B run (a second offline part with the same id) and MLflow run.
  cli.main(tiny.args("grpo", run_dir, dict(extra, **{"train.steps": "4", "train.resume": "true"})))
  assert trackers.read_ids(run_dir) == ids
  parts = wandb_offline_runs(run_dir)
  assert [p["id"] for p in parts] == [ids["wandb"]] * 2
  assert min(parts[1]["history"]) == 3  # it continued after the checkpoint at step 2
  history = {}
  for part in parts:
    for step, row in part["history"].items():
      history.setdefault(step, []).append(row)
  assert assert_holds_jsonl(
      run_dir, lambda s, k: [row.get(k) for row in history.get(s, [])]) > 40
  assert parts[1]["artifacts"]["curves.png"] == md5_base64(os.path.join(run_dir, "curves.png"))
  (run,) = client.search_runs([experiment.experiment_id])
  assert run.info.run_id == ids["mlflow"]["run_id"] and run.info.status == "FINISHED"
  assert max(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == 4
  assert assert_holds_jsonl(run_dir, mlflow_values) > 40


def test_failing_trackers_warn_once_and_training_goes_on(tmp_path, monkeypatch, caplog):
  """W&B's log raises at every call (a quota), MLflow's server is unreachable from the start:
  each is one warning line and the run ends with the same metrics.jsonl as without them."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
  monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
  calls = []

  def over_quota(self, *args, **kwargs):
    calls.append(kwargs.get("step"))
    raise ConnectionError("429 Too Many Requests:\nquota exceeded")
  monkeypatch.setattr(wandb.Run, "log", over_quota)
  run_dir = str(tmp_path / "run")
  with caplog.at_level(logging.WARNING, logger=trackers.__name__):
    result = cli.main(tiny.args("grpo", run_dir, {
        "train.loggers": "('jsonl', 'wandb', 'mlflow')",
        "train.mlflow_tracking_uri": "http://127.0.0.1:9"}))  # nothing listens on port 9
  assert int(result["state"].step) == 2
  warnings = [r.getMessage() for r in caplog.records if r.name == trackers.__name__]
  assert len(warnings) == 2 and all("\n" not in w for w in warnings), warnings
  assert any(w.startswith("wandb logger failed in log at step 0 (ConnectionError: 429")
             for w in warnings), warnings
  assert any(w.startswith("mlflow logger failed in start") for w in warnings), warnings
  assert calls == [0]  # switched off after its first failure
  steps = [r["step"] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))]
  assert steps == [0, 1, 2, 2]  # eval before, two steps, eval after


def test_a_user_logger_that_raises_is_one_warning_and_counted(tmp_path, monkeypatch, caplog):
  """Was: a logger registered in LOGGERS that raised killed the run. Now its first
  failure is one warning line, it keeps being called (a record that fails costs only itself),
  and its failures' total is one line at the end; metrics.jsonl is complete."""
  seen = []

  class Flaky:
    def log(self, step, metrics, stream="metrics"):
      seen.append(step)
      if step >= 1:
        raise ValueError(f"cannot send step {step}")

    def log_config(self, config):
      pass

    def log_artifact(self, path):
      pass

    def close(self):
      pass
  trackers.register_logger("flaky")(lambda config, start: Flaky())
  run_dir = str(tmp_path / "run")
  try:
    with caplog.at_level(logging.WARNING, logger=trackers.__name__):
      result = cli.main(tiny.args("grpo", run_dir, {"train.loggers": "('jsonl', 'flaky')"}))
  finally:
    trackers.LOGGERS.unregister("flaky")
  assert int(result["state"].step) == 2
  assert seen == [0, 1, 2, 2]  # called for every record, after its failures too
  warnings = [r.getMessage() for r in caplog.records if r.name == trackers.__name__]
  assert warnings == [
      "flaky logger failed in log at step 1 (ValueError: cannot send step 1); training goes on; "
      "its later failures are counted",
      "flaky logger failed 3 times in this run (the first is reported above)"]
  steps = [r["step"] for r in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))]
  assert steps == [0, 1, 2, 2]


# --- start-up checks, the eval table and the sweep's group ----------------------------------------

@pytest.mark.parametrize("overrides, error, match", [
    ({"train.loggers": "('jsonl', 'neptune')"}, UnknownComponentError,
     r"\['neptune'\] not registered; registered logger names: jsonl, mlflow, tensorboard, wandb"),
    ({"train.loggers": "('jsonl', 'wandb', 'wandb')"}, ConfigError, "distinct"),
    ({"train.loggers": "('tensorboard',)"}, ValueError, r"train\.loggers.*'jsonl'"),
    ({"train.tracker_group": "g"}, UnusedKeyError, r"train\.tracker_group='g' is not used"),
    ({"train.loggers": "('jsonl', 'wandb')", "train.mlflow_tracking_uri": "file:///x"},
     UnusedKeyError, r"train.loggers=\('jsonl', 'wandb'\) does not read it; it is read by "
                     r"logger 'mlflow'$"),
])
def test_logger_keys_are_checked_at_start(overrides, error, match):
  from rljax.config import checks as config_checks
  config = config_loader.load_config(BASE, list(overrides.items()))
  with pytest.raises(error, match=match):
    config_checks.check_config(config)


def test_missing_tracker_package_names_the_extra(monkeypatch):
  config = config_loader.load_config(BASE, [("train.loggers", "('jsonl', 'mlflow')")])
  monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(StartupError, match=r"pip install 'rljax\[mlflow\]'"):
    trackers.check_logger_packages(config)


def test_eval_table_rows_are_the_eval_records():
  records = [{"step": 0, "eval_accuracy": 0.25}, {"step": 1, "loss": 1.0},
             {"step": 2, "loss": 0.5, "eval_accuracy": 0.5, "eval_turns": 2.0},
             {"step": 2, "eval_accuracy": None}]
  assert eval_table(records) == (["step", "eval_accuracy", "eval_turns"],
                                 [[0, 0.25, None], [2, 0.5, 2.0], [2, None, None]])


def test_sweep_groups_tracked_runs_by_study(tmp_path):
  from rljax.sweep import runner, study as study_lib
  study = study_lib.Study(name="clip", config="configs/algos/grpo.py",
                          variants=(study_lib.Variant("base", ()),), seeds=(0, 1),
                          metrics=("final_accuracy",), baseline="base",
                          overrides=(("train.loggers", "('jsonl', 'wandb')"),))
  specs = runner.plan_runs(study, str(tmp_path))
  for spec, seed in zip(specs, (0, 1)):
    overrides = dict(spec.overrides)
    assert overrides["train.tracker_group"] == "clip"
    assert overrides["train.tracker_run_name"] == f"clip/base/seed{seed}"
  untracked = dataclasses.replace(study, overrides=())
  assert all("train.tracker_group" not in dict(s.overrides)
             for s in runner.plan_runs(untracked, str(tmp_path)))



def test_a_fresh_run_drops_the_tracker_ids_an_earlier_run_left(tmp_path):
  run_dir = str(tmp_path)
  earlier = {"mlflow": {"run_id": "0123", "tracking_uri": "file:///elsewhere"}}
  with open(os.path.join(run_dir, trackers.IDS_FILE), "w") as f:
    json.dump(earlier, f)
  for resume, kept in (("true", earlier), ("false", {})):
    config = config_loader.load_config(BASE, [("train.run_dir", run_dir),
                                              ("train.resume", resume)])
    for logger in trackers.factory(config)(run_dir, 0):
      logger.close()
    assert trackers.read_ids(run_dir) == kept


def test_side_streams_reach_the_trackers(tmp_path, monkeypatch):
  """Critic pre-training's stream: MLflow metrics ``pretrain/<key>`` at their own steps, one W&B
  table (W&B's history has one step axis, which the main stream holds)."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
  store = f"file://{tmp_path / 'mlruns'}"
  run_dir = str(tmp_path / "run")
  config = config_loader.load_config(BASE, [
      ("train.run_dir", run_dir), ("train.loggers", "('jsonl', 'wandb', 'mlflow')"),
      ("train.mlflow_tracking_uri", store)])
  losses = [1.0, 0.5, 0.25]
  with MetricsWriter(run_dir, enabled=True, progress_total=None, progress=False, start_step=0,
                     loggers=trackers.factory(config)) as writer:
    writer.write(0, {"eval_accuracy": 0.5})
    for i, loss in enumerate(losses):
      writer.write_named("pretrain", i, {"value_loss": loss})
    writer.write(1, {"loss": 2.0})
  (run,) = wandb_offline_runs(run_dir)
  assert run["history"][0] == {"eval_accuracy": 0.5, **{k: run["history"][0][k]
                                                        for k in ("_runtime", "_timestamp")}}
  # A table is a file of the run; its history cell (nested keys) holds the path.
  (path,) = [row["pretrain/path"] for row in run["history"].values() if "pretrain/path" in row]
  (files,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "files"))
  with open(os.path.join(files, path)) as f:
    table = json.load(f)
  assert table["columns"] == ["step", "value_loss"]
  assert table["data"] == [[i, loss] for i, loss in enumerate(losses)]
  client = MlflowClient(store)
  run_id = trackers.read_ids(run_dir)["mlflow"]["run_id"]
  history = client.get_metric_history(run_id, "pretrain/value_loss")
  assert sorted((m.step, m.value) for m in history) == list(enumerate(losses))
  assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 2.0)]

"""Experiment trackers: W&B and MLflow as loggers (``rljax.runs.metrics.Logger``), chosen by name.

``train.loggers`` names the run's loggers in ``LOGGERS`` (``rljax.registries``, filled by the
modules of ``rljax.runs``): ``jsonl`` (always: the run's own record), ``tensorboard``, ``wandb``,
``mlflow`` (registered here), and any logger registered with ``register_logger`` (a module of
``rljax.runs``, a notebook, a test file). A tracker gets every record ``metrics.jsonl`` gets, at
the same step; side streams (critic pre-training) as ``<stream>/<key>`` metrics in
MLflow and as one ``<stream>`` table in W&B (its history has a single step axis); the resolved
config once, when the tracker's run is created; and the finished ``curves.png`` and ``evals.csv``.

**Resume.** The tracker run's id is kept in ``run_dir/trackers.json``. A run started with
``train.resume=True`` continues the W&B / MLflow run recorded there (a tracker added on resume
starts a new one); a fresh run replaces the record.

**Failures.** A logger other than the run's own files (``jsonl``, ``tensorboard``: a failure
there, a full disk, stops the run as its checkpoints would) never stops training (``Guarded``):
a tracker that raises (no network, a quota, a server error), when it starts or at any call, is
reported in one warning line and switched off for the rest of the run; a logger a user registers
in ``LOGGERS`` that raises is one warning line, keeps being called, and its failures are counted
(their total is one line at the end). A tracker whose package is missing is a start-up error
naming the extra to install.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import secrets
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from rljax.errors import StartupError
from rljax.registries import LOGGERS
from rljax.runs.metrics import MAIN, JsonlLogger, TensorBoardLogger
from rljax.runs.run_dir import flatten_config

logger = logging.getLogger(__name__)

IDS_FILE = "trackers.json"  # {"wandb": run id, "mlflow": {"run_id": ..., "tracking_uri": ...}}


# --- the run's tracker ids -----------------------------------------------------------------------

def read_ids(run_dir: str) -> dict:
  try:
    with open(os.path.join(run_dir, IDS_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _store_id(run_dir: str, name: str, value) -> None:
  """Record a tracker's run id (atomically), so that a resume finds it."""
  ids = dict(read_ids(run_dir), **{name: value})
  path = os.path.join(run_dir, IDS_FILE)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(ids, f)
  os.replace(tmp, path)


def run_name(config) -> str:
  return config.train.tracker_run_name or os.path.basename(
      os.path.normpath(os.path.abspath(config.train.run_dir)))


# --- W&B -----------------------------------------------------------------------------------------

class WandbLogger:
  """One W&B run, its files under ``run_dir/wandb`` (``WANDB_MODE=offline`` keeps it there;
  ``wandb sync`` uploads it later). Entity, API key and mode come from W&B's own environment
  variables."""

  def __init__(self, config, resume: bool):
    import wandb  # heavy optional dependency (rljax[wandb])
    t = config.train
    self._wandb = wandb
    stored = read_ids(t.run_dir).get("wandb") if resume else None
    self.resumed = stored is not None
    run_id = stored or secrets.token_hex(6)  # W&B run ids: lowercase letters and digits
    _store_id(t.run_dir, "wandb", run_id)  # before init: a run killed during it resumes the id
    self.run = wandb.init(
        project=t.tracker_project, name=run_name(config), group=t.tracker_group or None,
        tags=list(t.tracker_tags), id=run_id, resume="allow", dir=t.run_dir,
        reinit="create_new",  # never finishes a run the user's own code holds open
        settings=wandb.Settings(silent=True, console="off"))
    self._side: dict[str, list] = {}  # stream -> records, sent as a table at close

  def log(self, step: int, metrics: Mapping[str, float], stream: str = MAIN) -> None:
    if stream == MAIN:
      # W&B merges the records of one step (train metrics, then the final eval) into one row.
      self.run.log(dict(metrics), step=int(step))
    else:
      self._side.setdefault(stream, []).append({"step": int(step), **metrics})

  def log_config(self, config: Mapping[str, Any]) -> None:
    if not self.resumed:
      self.run.config.update(dict(config), allow_val_change=True)

  def log_artifact(self, path: str) -> None:
    name = re.sub(r"[^\w.-]", "_", f"{self.run.id}-{os.path.basename(path)}")
    artifact = self._wandb.Artifact(name, type="run-file")
    artifact.add_file(path)
    self.run.log_artifact(artifact)

  def close(self) -> None:
    for stream, records in self._side.items():
      columns = sorted({k for r in records for k in r}, key=lambda k: (k != "step", k))
      table = self._wandb.Table(columns=columns, data=[[r.get(k) for k in columns]
                                                       for r in records])
      self.run.log({stream: table}, commit=False)
    self._side.clear()
    self.run.finish()


# --- MLflow --------------------------------------------------------------------------------------

MLFLOW_PARAMS_PER_BATCH = 100  # MLflow's limit on params in one log_batch call
MLFLOW_METRICS_PER_BATCH = 1000  # ... and on metrics


class MlflowLogger:
  """One MLflow run in the experiment ``train.tracker_project`` of ``train.mlflow_tracking_uri``
  (``''``: MLflow's default). The config is logged as params (one per dotted key) and as the
  artifact ``config.json``; the run is marked FINISHED at close and RUNNING again on resume."""

  def __init__(self, config, resume: bool):
    from mlflow.tracking import MlflowClient  # heavy optional dependency (rljax[mlflow])
    from mlflow.entities import Metric, Param
    t = config.train
    self._metric, self._param = Metric, Param
    self.client = MlflowClient(t.mlflow_tracking_uri or None)
    uri = self.client.tracking_uri
    stored = read_ids(t.run_dir).get("mlflow") if resume else None
    if stored and stored.get("tracking_uri") == uri:
      self.run_id, self.resumed = stored["run_id"], True
      self.client.update_run(self.run_id, status="RUNNING")
    else:
      tags = {tag: "" for tag in t.tracker_tags}
      tags["rljax.run_dir"] = os.path.abspath(t.run_dir)
      if t.tracker_group:
        tags["rljax.group"] = t.tracker_group
      run = self.client.create_run(self._experiment(t.tracker_project), run_name=run_name(config),
                                   tags=tags)
      self.run_id, self.resumed = run.info.run_id, False
      _store_id(t.run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": uri})

  def _experiment(self, name: str) -> str:
    found = self.client.get_experiment_by_name(name)
    if found is not None:
      return found.experiment_id
    try:
      return self.client.create_experiment(name)
    except Exception:  # (MlflowException) another run of the sweep created it first
      found = self.client.get_experiment_by_name(name)
      if found is None:
        raise
      return found.experiment_id

  def log(self, step: int, metrics: Mapping[str, float], stream: str = MAIN) -> None:
    now = int(time.time() * 1000)
    prefix = "" if stream == MAIN else f"{stream}/"
    batch = [self._metric(mlflow_key(prefix + k), v, now, int(step)) for k, v in metrics.items()]
    for i in range(0, len(batch), MLFLOW_METRICS_PER_BATCH):
      self.client.log_batch(self.run_id, metrics=batch[i:i + MLFLOW_METRICS_PER_BATCH])

  def log_config(self, config: Mapping[str, Any]) -> None:
    if self.resumed:  # params are immutable; the run holds them already
      return
    params = [self._param(mlflow_key(k), json.dumps(v) if not isinstance(v, str) else v)
              for k, v in sorted(flatten_config(dict(config)).items())]
    for i in range(0, len(params), MLFLOW_PARAMS_PER_BATCH):
      self.client.log_batch(self.run_id, params=params[i:i + MLFLOW_PARAMS_PER_BATCH])
    self.client.log_text(self.run_id, json.dumps(config, indent=2), "config.json")

  def log_artifact(self, path: str) -> None:
    self.client.log_artifact(self.run_id, path)

  def close(self) -> None:
    self.client.set_terminated(self.run_id)


def mlflow_key(key: str) -> str:
  """A metric or param name MLflow accepts (letters, digits, ``_ - . / space``): others -> ``_``."""
  return re.sub(r"[^\w\-. /]", "_", key)


# --- the registry and failure isolation ----------------------------------------------------------

class Guarded:
  """A logger that never stops training: its first exception is one warning line, later ones are
  counted (``failures``) and their total is one line when the run closes it. A tracker
  (``stays_on=False``: W&B, MLflow) is off after its first failure (each later call would likely
  fail, and cost a timeout); a logger a user registered keeps being called, so one bad record
  costs only that record."""

  def __init__(self, name: str, make: Callable[[], Any], stays_on: bool = True):
    self.name, self.inner, self.stays_on, self.failures = name, None, stays_on, 0
    self.inner = self._call("start", make)

  def _call(self, what: str, fn: Callable[[], Any], step: int | None = None):
    try:
      return fn()
    except Exception as e:  # network, quota, a raising backend: warn once, train on
      self.failures += 1
      if self.failures == 1:
        where = f" at step {step}" if step is not None else ""
        message = " ".join(str(e).split())[:300]
        then = ("it is off for the rest of this run" if not self.stays_on or what == "start"
                else "training goes on; its later failures are counted")
        logger.warning("%s logger failed in %s%s (%s: %s); %s", self.name, what, where,
                       type(e).__name__, message, then)
      if not self.stays_on or what == "start":
        self.inner = None

  def log(self, step: int, metrics: Mapping[str, float], stream: str = MAIN) -> None:
    if self.inner is not None:
      self._call("log", lambda: self.inner.log(step, metrics, stream), step)

  def log_config(self, config: Mapping[str, Any]) -> None:
    if self.inner is not None:
      self._call("log_config", lambda: self.inner.log_config(config))

  def log_artifact(self, path: str) -> None:
    if self.inner is not None:
      self._call("log_artifact", lambda: self.inner.log_artifact(path))

  def close(self) -> None:
    if self.inner is not None:
      self._call("close", self.inner.close)
      self.inner = None
    if self.failures > 1:
      logger.warning("%s logger failed %d times in this run (the first is reported above)",
                     self.name, self.failures)
      self.failures = 0  # close is idempotent: reported once


def register_logger(name: str, *, reads: Sequence[str] = (), package: Optional[str] = None,
                    run_file: bool = False) -> Callable:
  """``@register_logger("name")`` on ``factory(config, start_step) -> Logger`` (a
  ``rljax.runs.metrics.Logger``: ``log``, ``log_config``, ``log_artifact``, ``close``):
  selectable in ``train.loggers``. ``reads``: the ``train.*`` keys only it reads; ``package``: the
  optional package it needs, installed with the extra ``rljax[name]`` (a tracker: ``Guarded``
  switches it off after its first failure); ``run_file``: it writes the run dir's own files,
  whose failure (a full disk) is the run's, so it is not ``Guarded`` (every other logger is, one
  a user registers included)."""
  return LOGGERS.register(name, reads=reads, package=package, run_file=run_file)


TRACKER_KEYS = ("train.tracker_project", "train.tracker_run_name", "train.tracker_group",
                "train.tracker_tags")  # what a tracking service's logger reads


@register_logger("jsonl", run_file=True)
def jsonl_logger(config, start):
  """The run's own record, ``run_dir/metrics.jsonl`` (``JsonlLogger``), read back by resumes,
  evals and sweeps: always on."""
  return JsonlLogger(config.train.run_dir, start)


@register_logger("tensorboard", run_file=True)
def tensorboard_logger(config, start):
  """TensorBoard event files under ``run_dir/tb`` (``TensorBoardLogger``)."""
  return TensorBoardLogger(config.train.run_dir, start)


@register_logger("wandb", reads=TRACKER_KEYS, package="wandb")
def wandb_logger(config, start):
  """A W&B run (``WandbLogger``)."""
  return WandbLogger(config, config.train.resume)


@register_logger("mlflow", reads=TRACKER_KEYS + ("train.mlflow_tracking_uri",), package="mlflow")
def mlflow_logger(config, start):
  """An MLflow run (``MlflowLogger``)."""
  return MlflowLogger(config, config.train.resume)


def check_logger_packages(config) -> None:
  """Start-up check of ``train.loggers`` beyond its key's (registered names, none twice): the
  packages its loggers need are installed, and MLflow takes ``train.mlflow_tracking_uri``."""
  for name in config.train.loggers:
    package = LOGGERS.meta(name)["package"]
    if package and importlib.util.find_spec(package) is None:
      raise StartupError(f"train.loggers names {name!r} but {package} is not installed: "
                         f"pip install 'rljax[{name}]'")
  if "mlflow" in config.train.loggers:
    _check_mlflow_store(config.train.mlflow_tracking_uri)


def _check_mlflow_store(uri: str) -> None:
  """A store MLflow refuses (an unknown scheme, a file store it keeps opt-in) fails the client's
  construction, which opens no connection: refused here, not a run that trains untracked after
  one warning (``Guarded``). A server that is down is found at the first call, as a warning."""
  from mlflow.tracking import MlflowClient  # rljax[mlflow], checked installed above
  try:
    MlflowClient(uri or None)
  except Exception as e:  # MlflowException and its subclasses
    message = " ".join(str(e).split())[:300]
    raise StartupError(f"train.mlflow_tracking_uri={uri!r}: MLflow refuses this store "
                       f"({type(e).__name__}: {message})") from None


def factory(config) -> Callable[[str, int | None], list]:
  """The ``MetricsWriter(loggers=...)`` argument of ``config``: its ``train.loggers`` in order,
  each but the run's own files ``Guarded`` (a tracker off after its first failure). A fresh run
  first drops the tracker ids an earlier run left in its run dir: they are not its runs, and a
  later resume must not continue them."""
  def make(run_dir: str, start: int | None) -> list:
    if not config.train.resume:
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(run_dir, IDS_FILE))
    return [_started(name, config, start) for name in config.train.loggers]
  return make


def _started(name: str, config, start: int | None):
  meta = LOGGERS.meta(name)
  if meta["run_file"]:
    return LOGGERS.get(name)(config, start)
  return Guarded(name, lambda: LOGGERS.get(name)(config, start), stays_on=not meta["package"])

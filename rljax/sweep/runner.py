"""Run a study: every (variant, seed) as its own ``rljax train`` subprocess, resumably.

Layout under ``root`` (default ``runs/studies``)::

  <root>/<study>/<variant>/seed<k>/   one run dir (metrics.jsonl, checkpoints/, sweep_wall.json)
  <root>/<study>/results/             the aggregate (CSV, markdown, PNG)
  <root>/_sft/<hash>/                 SFT cold starts, shared by every study, variant and seed
                                      whose cold start is the same (same stamp as rljax.train.sft)
  <root>/_rlhf_rm/seed<k>-<hash>/     the RLHF cold start's reward model (reward.gold.pairs > 0)
                                      and its pairs, one per seed, shared like the SFT ones
  <root>/_xla_cache/                  the compiled programs of every run (``shared_cache_env``)

A new run whose complete config a finished run of another study under the same root already ran
(a baseline that several studies compare against) is not run again: its directory becomes a link
to that run (``finished_twin``).

Seeds: run k sets ``seed=k`` (policy init, rollout sampling, eval sampling) and
``data.train_seed=k`` (the order of training prompts; without it every seed would see the same
prompts). The held-out eval set (``data.eval_seed``) stays the same for all runs, so runs are
compared on the same problems. An SFT cold start does not depend on either (its init and examples
come from ``sft.seed``): the seeds of a study are RL runs from one cold start, as the field's runs
start from one pretrained model; a study that varies the cold start sets ``sft.seed`` in a
variant.

A run's state is read from its directory: *finished* when metrics.jsonl holds the final eval (the
``eval_accuracy`` record at ``train.steps``), *partial* when it has a committed checkpoint or the
config the trainer writes at its start (its command carries ``--config.train.resume=True``), *new*
otherwise. A run dir that holds a run of a different config is an error, so
that results of another study version are never mixed in. The one exception is a finished run
that differs only in framework defaults the study does not set (rljax changed a default after the
run): it is aggregated with a warning naming the keys, since it ran what the study asked for then.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable

from rljax.config import effects, loader as config_loader, table
from rljax import lifetime
from rljax.registries import LOGGERS
from rljax.sweep import study as study_lib
from rljax.runs import run_dir as run_dir_lib
from rljax.train import sft
from rljax.runs.metrics import read_jsonl
from rljax.runs.run_dir import flatten_config

WALL_FILE = "sweep_wall.json"  # per run dir: wall time and exit status of each attempt
LOG_FILE = "sweep.log"  # per run dir: stdout and stderr of the train subprocess
# Keys that change neither what a run computes nor its results (their declared effect, layout or
# bookkeeping: rljax.config.effects.same_result): a run dir written with other values (or before
# the key existed) is the same run. The run dir itself is one: a run linked from another study
# (finished_twin) or a study root moved elsewhere holds the same run.
def _ignored(key: str) -> bool:
  return effects.same_result(key)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One (variant, seed) run: where it lives and the overrides that make it."""
  variant: str
  seed: int
  run_dir: str
  overrides: tuple[tuple[str, str], ...]
  steps: int
  sft_dir: str | None  # the cold start it loads (model.source='sft'), else None


@dataclasses.dataclass(frozen=True)
class Job:
  """A subprocess to run: a cold start or a train run."""
  label: str
  argv: tuple[str, ...]
  log_path: str
  wall_path: str | None
  sft_dir: str | None = None  # the cold start a train job needs (or a cold-start job writes)
  run: str = ""  # 'variant/seed<k>' of a train job
  spec: RunSpec | None = None  # a train job's run: exit 0 is "ok" only when it is finished


def study_dir(root: str, study: study_lib.Study) -> str:
  return os.path.join(root, study.name)


def plan_runs(study: study_lib.Study, root: str,
              extra: Iterable[tuple[str, str]] = ()) -> list[RunSpec]:
  """Every (variant, seed) of ``study`` in table order, its overrides complete (including
  ``extra``, e.g. ``--set train.steps=2`` for a smoke run). Loads each config, so a misspelt key
  fails here, before anything runs."""
  extra = tuple(extra)
  specs = []
  for variant in study.variants:
    for seed in study.seeds:
      run_dir = os.path.abspath(os.path.join(study_dir(root, study), variant.name, f"seed{seed}"))
      # A run's output goes to its sweep.log, where a progress bar is only noise.
      per_run = (("train.progress", "false"),) + extra + (
          ("seed", str(seed)), ("data.train_seed", str(seed)), ("train.run_dir", run_dir))
      config = study_lib.variant_config(study, variant, per_run)
      if any("train.tracker_group" in LOGGERS.meta(n)["reads"] for n in config.train.loggers):
        # W&B/MLflow runs of a study: one group per study, named by variant and seed.
        per_run += (("train.tracker_group", study.name),
                    ("train.tracker_run_name", f"{study.name}/{variant.name}/seed{seed}"))
      sft_dir = None
      if config.model.source == "sft":
        key = sft.stamp_key(sft.cold_start_stamp(config))
        sft_dir = os.path.abspath(os.path.join(root, "_sft", key))
        per_run += (("sft.out_dir", sft_dir),)
      if config.reward.gold.pairs:
        # Each seed's reward model is trained on its own pairs (rljax.train.rlhf), so a run's
        # results never depend on which run of the study trained it first.
        rm_dir = os.path.abspath(os.path.join(
            root, "_rlhf_rm", f"seed{seed}-{_reward_model_key(config, sft_dir)}"))
        per_run += (("reward.model.source", f"run:{rm_dir}"),
                    ("rm.train_file", rm_dir + ".pairs.jsonl"))
      specs.append(RunSpec(variant.name, seed, run_dir,
                           study.overrides + variant.overrides + per_run,
                           int(config.train.steps), sft_dir))
  return specs


# What `rljax rm` reads of a run's config (rljax.train.rlhf.rm_config): its pairs, model, data,
# optimizer and seed; not the reward model's own directory or pairs file, which the key names.
_REWARD_MODEL_SECTIONS = ("rm", "model", "data", "optim", "reward.gold")
_REWARD_MODEL_OWN_KEYS = {"rm.train_file"}


def _reward_model_key(config, sft_dir: str | None) -> str:
  """A short hash of what the RLHF cold start's reward model depends on (its SFT start too)."""
  flat = flatten_config(config.to_dict())
  used = {k: v for k, v in flat.items() if k not in _REWARD_MODEL_OWN_KEYS and (
      k == "seed" or any(k.startswith(section + ".") for section in _REWARD_MODEL_SECTIONS))}
  used["sft.out_dir"] = os.path.basename(sft_dir or "")
  return hashlib.sha256(json.dumps(used, sort_keys=True, default=str).encode()).hexdigest()[:10]


# --- state of a run dir ---------------------------------------------------------------------------

def run_state(spec: RunSpec) -> str:
  """'finished', 'partial' (has a committed checkpoint) or 'new' (module docstring)."""
  metrics = os.path.join(spec.run_dir, "metrics.jsonl")
  if os.path.isfile(metrics):
    if any(r["step"] == spec.steps and "eval_accuracy" in r for r in read_jsonl(metrics)):
      return "finished"
  ckpt = os.path.join(spec.run_dir, "checkpoints")
  if os.path.isdir(ckpt) and any(
      name.isdigit() and os.path.isfile(os.path.join(ckpt, name, "commit_success.txt"))
      for name in os.listdir(ckpt)):
    return "partial"
  return "new"


def check_same_config(spec: RunSpec, config_path: str, finished: bool = False) -> list[str]:
  """Raise if ``spec.run_dir`` holds a run made with another config than ``spec`` asks for; for a
  finished run, differences in framework defaults only are returned (module docstring)."""
  saved = os.path.join(spec.run_dir, "config.json")
  if not os.path.isfile(saved):
    return []
  want = _wanted_config(spec, config_path)
  with open(saved) as f:
    have = flatten_config(json.load(f))
  default = _default_config()
  differing = sorted(k for k in (set(want) | set(have))
                     if not _ignored(k) and want.get(k, _MISSING) != have.get(k, _MISSING))
  chosen = {k for k, _ in spec.overrides}
  # A key the study leaves at today's default, while the run has another value: the default moved.
  # A key the run lacks (rljax added it later) wanted at its default: a new key's default is what
  # rljax did before it, also where the study names that value.
  drift = [k for k in differing
           if want.get(k, _MISSING) == default.get(k, _MISSING)
           and (k not in chosen or have.get(k, _MISSING) == _MISSING)]
  if not differing or (finished and drift == differing):
    return [f"{k}: run dir has {have.get(k, _MISSING)!r}, today's default {want.get(k, _MISSING)!r}"
            for k in drift]
  k = next(k for k in differing if k not in drift or not finished)
  raise study_lib.StudyError(
      f"{spec.run_dir} holds a run with another config ({k}: study wants "
      f"{want.get(k, _MISSING)!r}, run dir has {have.get(k, _MISSING)!r}); delete that directory "
      "to rerun it, or choose another --root")


_MISSING = "<missing>"


def _default_config() -> dict:
  """Today's framework defaults, flattened as a run's saved config is."""
  return flatten_config(json.loads(table.get_config().to_json_best_effort()))


def _wanted_config(spec: RunSpec, config_path: str) -> dict:
  """The flattened config ``spec`` runs with."""
  return flatten_config(json.loads(
      config_loader.load_config(config_path, list(spec.overrides)).to_json_best_effort()))


def _comparable(flat: dict) -> dict:
  """A flattened config without the keys that differ between two runs of the same computation
  (``_ignored``)."""
  return {k: v for k, v in flat.items() if not _ignored(k)}


def finished_twin(spec: RunSpec, config_path: str) -> str | None:
  """A finished run dir of another study or variant under the same root whose saved config is
  ``spec``'s in every key but the run dir (and the keys that change no result), else None."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(spec.run_dir)))
  want = _comparable(_wanted_config(spec, config_path))
  # A key rljax added after a run was made: the run did what the key's default does.
  default = _default_config()
  added_later = {k: default[k] for k in want if k in default}
  own = os.path.realpath(spec.run_dir)
  for saved in sorted(glob.glob(os.path.join(root, "*", "*", f"seed{spec.seed}", "config.json"))):
    run_dir = os.path.dirname(saved)
    if os.path.islink(run_dir) or os.path.realpath(run_dir) == own:
      continue
    with open(saved) as f:
      if _comparable({**added_later, **flatten_config(json.load(f))}) != want:
        continue
    if run_state(dataclasses.replace(spec, run_dir=run_dir)) == "finished":
      return run_dir
  return None


def read_wall(run_dir: str) -> list[dict]:
  """The recorded attempts of a run: ``[{'wall_s': float, 'returncode': int}, ...]``."""
  path = os.path.join(run_dir, WALL_FILE)
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return json.load(f)


# --- commands ---------------------------------------------------------------------------------------

def train_argv(spec: RunSpec, config_path: str, python: str = sys.executable) -> tuple[str, ...]:
  """The run's ``rljax train`` command; it resumes when the run dir already holds a run (the
  trainer refuses ``resume=True`` on a dir with none, a misspelt path)."""
  resume = ("--config.train.resume=True",) if run_dir_lib.holds_run(spec.run_dir) else ()
  return (python, "-m", "rljax", "train", "--config", config_path,
          *[f"--config.{k}={v}" for k, v in spec.overrides], *resume)


def sft_argv(spec: RunSpec, config_path: str, python: str = sys.executable) -> tuple[str, ...]:
  """The run's cold start: ``rljax sft`` with the run's overrides of the keys it reads (it
  refuses the others, e.g. the algorithm's)."""
  return (python, "-m", "rljax", "sft", "--config", config_path,
          *[f"--config.{k}={v}" for k, v in spec.overrides if effects.read_by("sft", k)])


def sft_is_ready(spec: RunSpec, config_path: str) -> bool:
  """Whether the cold start ``spec`` loads is on disk with the stamp the trainer checks."""
  config = config_loader.load_config(config_path, list(spec.overrides))
  return sft.read_stamp(spec.sft_dir) == sft.cold_start_stamp(config)


def printable(argv: Iterable[str]) -> str:
  """A command line for a shell on another machine: ``python`` and paths relative to the cwd."""
  inside = os.getcwd() + os.sep
  parts = []
  for i, arg in enumerate(argv):
    if i == 0:
      parts.append("python")
      continue
    key, sep, value = arg.partition("=")
    if value.startswith(inside):
      arg = key + sep + os.path.relpath(value)
    elif arg.startswith(inside):
      arg = os.path.relpath(arg)
    parts.append(arg)
  return shlex.join(parts)


# --- the runs' processes ----------------------------------------------------------------------------
# Every job runs in its own session and process group (what it starts, e.g. the SFT cold start,
# is in it too) and dies with the sweep (rljax.lifetime). SIGTERM and SIGINT sent to the sweep
# are forwarded to the group of every running job (a run stops as a preempted one does: at a step
# boundary, with a checkpoint), no job starts after them, and a second one kills the groups.

_LIVE: dict[int, subprocess.Popen] = {}  # pid -> the running job's process
_LIVE_LOCK = threading.RLock()  # re-entered by the signal handler in the main thread
_SIGNALS: list[int] = []  # received by this sweep, in order


def stop_signal() -> int | None:
  """The first SIGTERM/SIGINT the sweep received (None: none): no job starts after it."""
  return _SIGNALS[0] if _SIGNALS else None


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
  try:
    os.killpg(proc.pid, signum)
  except (ProcessLookupError, PermissionError):  # ended (and reaped) meanwhile
    pass


def _forwarded() -> int:
  """What a job gets: the first signal, SIGKILL after a second one."""
  return _SIGNALS[0] if len(_SIGNALS) == 1 else signal.SIGKILL


def _forward(signum: int, frame=None) -> None:
  _SIGNALS.append(signum)
  with _LIVE_LOCK:
    for proc in list(_LIVE.values()):
      _signal_group(proc, _forwarded())


@contextlib.contextmanager
def forwarding_signals():
  """Within the block, SIGTERM/SIGINT go to the running jobs (see above); on leaving it, jobs
  still running (an exception left the block) are sent SIGTERM, then SIGKILL after 30 s, and the
  signals received are forgotten (jobs run later in this process start again)."""
  del _SIGNALS[:]
  main = threading.current_thread() is threading.main_thread()
  previous = {s: signal.signal(s, _forward) for s in (signal.SIGTERM, signal.SIGINT)} if main \
      else {}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    with _LIVE_LOCK:
      left = list(_LIVE.values())
    for proc in left:
      _signal_group(proc, signal.SIGTERM)
    for proc in left:
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
    del _SIGNALS[:]


def _run_child(argv, log, env) -> int | None:
  """``argv``'s exit status (None: not started, the sweep is stopping)."""
  with _LIVE_LOCK:
    if _SIGNALS:
      return None
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=lifetime.child_env(env))
    _LIVE[proc.pid] = proc
    if _SIGNALS:  # arrived (in this thread's handler) while the process was being started
      _signal_group(proc, _forwarded())
  try:
    return proc.wait()
  finally:
    with _LIVE_LOCK:
      _LIVE.pop(proc.pid, None)


# --- running -----------------------------------------------------------------------------------------

def shared_cache_env(root: str) -> dict[str, str]:
  """The environment that gives every run of a sweep one compilation cache, ``<root>/_xla_cache``
  (rljax.runs.compilation_cache): a study's runs compile the same programs, so only the first
  compiles them. A ``JAX_COMPILATION_CACHE_DIR`` the user set is kept."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return {}
  return {"JAX_COMPILATION_CACHE_DIR": os.path.abspath(os.path.join(root, "_xla_cache"))}


def run_job(job: Job, env: dict[str, str] | None = None) -> dict:
  """Run one subprocess (``env``: added to this process's environment), its output appended to
  ``job.log_path``; records the attempt's wall time in ``job.wall_path``. Returns ``{'label',
  'returncode', 'wall_s', 'log'}``; returncode None when the sweep was stopped before the job
  started (nothing recorded)."""
  os.makedirs(os.path.dirname(job.log_path), exist_ok=True)
  env = {**os.environ, **(env or {})}
  # The subprocess imports the same rljax as this process, wherever the cwd is.
  env["PYTHONPATH"] = os.pathsep.join(p for p in (study_lib.REPO_ROOT, env.get("PYTHONPATH"))
                                      if p)
  t0 = time.perf_counter()
  with open(job.log_path, "a", encoding="utf-8") as log:
    log.write(f"$ {shlex.join(job.argv)}\n")
    log.flush()
    returncode = _run_child(job.argv, log, env)
  wall = time.perf_counter() - t0
  if returncode is None:
    return {"label": job.label, "returncode": None, "wall_s": 0.0, "log": job.log_path,
            "job": job}
  if job.wall_path is not None:
    attempts = read_wall(os.path.dirname(job.wall_path))
    attempts.append({"wall_s": wall, "returncode": returncode})
    tmp = job.wall_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(attempts, f, indent=1)
    os.replace(tmp, job.wall_path)
  return {"label": job.label, "returncode": returncode, "wall_s": wall, "log": job.log_path,
          "job": job}


def _finished(job: Job) -> bool:
  """A cold start that exits 0 is complete; a train run only when its final eval is logged."""
  return job.spec is None or run_state(job.spec) == "finished"


def run_jobs(jobs: list[Job], parallel: int, log: Callable[[str], None] = print,
             env: dict[str, str] | None = None) -> list[dict]:
  """Run ``jobs`` with at most ``parallel`` at once (in list order when sequential), ``env``
  added to each one's environment."""
  def report(result):
    status = ("not started (the sweep is stopping)" if result["returncode"] is None else
              f"FAILED (exit {result['returncode']})" if result["returncode"] != 0 else
              "ok" if _finished(result["job"]) else
              "stopped before its last step (a preemption exits cleanly); the next sweep "
              "resumes it")
    log(f"done  {result['label']}: {status} in {result['wall_s']:.0f} s (log {result['log']})")
    return result

  if parallel <= 1:
    results = []
    for job in jobs:
      log(f"start {job.label}")
      results.append(report(run_job(job, env)))
    return results
  with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
    for job in jobs:
      log(f"queue {job.label}")
    futures = [pool.submit(run_job, job, env) for job in jobs]
    return [report(f.result()) for f in concurrent.futures.as_completed(futures)]


def _untouched(run_dir: str) -> bool:
  """No run was started in ``run_dir``: it is absent, or holds only the sweep's log and wall
  record of attempts stopped before ``rljax train`` wrote anything (a sweep stopped early)."""
  return not os.path.exists(run_dir) or set(os.listdir(run_dir)) <= {LOG_FILE, WALL_FILE}


def pending_jobs(specs: list[RunSpec], config_path: str, link_twins: bool = True
                 ) -> tuple[list[Job], list[Job], dict]:
  """(cold-start jobs, train jobs, state of every run) for the runs that are not finished. A new
  run with a finished twin (``finished_twin``) is linked to it when ``link_twins``, and counts
  as finished either way."""
  states, sft_jobs, train_jobs, sft_seen = {}, [], [], set()
  for spec in specs:
    state = run_state(spec)
    twin = finished_twin(spec, config_path) if _untouched(spec.run_dir) else None
    if twin is not None:
      if link_twins:
        os.makedirs(os.path.dirname(spec.run_dir), exist_ok=True)
        if os.path.isdir(spec.run_dir):
          for name in os.listdir(spec.run_dir):  # the logs of attempts that never started
            os.remove(os.path.join(spec.run_dir, name))
          os.rmdir(spec.run_dir)
        os.symlink(twin, spec.run_dir)
      print(f"{spec.variant}/seed{spec.seed}: the same run as {twin}, shared", flush=True)
      states[(spec.variant, spec.seed)] = "finished"
      continue
    # Finished ones too: never aggregate another config.
    for line in check_same_config(spec, config_path, finished=state == "finished"):
      print(f"warning: {spec.run_dir} ran with another framework default, aggregated as it is "
            f"({line})", flush=True)
    states[(spec.variant, spec.seed)] = state
    if state == "finished":
      continue
    if spec.sft_dir and spec.sft_dir not in sft_seen and not sft_is_ready(spec, config_path):
      sft_seen.add(spec.sft_dir)
      sft_jobs.append(Job(f"cold start {os.path.basename(spec.sft_dir)}",
                          sft_argv(spec, config_path), spec.sft_dir + ".log", None,
                          sft_dir=spec.sft_dir))
    train_jobs.append(Job(f"{spec.variant}/seed{spec.seed} ({state})",
                          train_argv(spec, config_path), os.path.join(spec.run_dir, LOG_FILE),
                          os.path.join(spec.run_dir, WALL_FILE), sft_dir=spec.sft_dir,
                          run=f"{spec.variant}/seed{spec.seed}", spec=spec))
  return sft_jobs, train_jobs, states

"""``rljax sweep STUDY``: run a study's missing runs, then aggregate all of them.

  python -m rljax sweep experiments/studies/dapo_ladder.py                 # sequential
  python -m rljax sweep experiments/studies/dapo_ladder.py --parallel 2
  python -m rljax sweep experiments/studies/dapo_ladder.py --print-commands > jobs.txt
  python -m rljax sweep experiments/studies/dapo_ladder.py --aggregate-only
  python -m rljax sweep STUDY --root /tmp/smoke --set train.steps=2 --seeds 0   # smoke run

Finished runs are skipped, killed ones resume from their last checkpoint, and a finished study
only re-aggregates (rljax.sweep.runner). SIGTERM or Ctrl-C stops the runs in flight (forwarded
to them; a second one kills them) and starts no other; kill -9 of the sweep stops its runs too
(rljax.lifetime): no process is left, and the same command resumes. Results go to
``<root>/<study>/results/``:
``runs.csv`` (one row per run), ``summary.csv`` (per variant and metric: mean, 95% t-interval,
paired difference to the baseline), ``results.md`` (the tables) and ``curves.png``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal

from rljax.errors import ArgumentParser
from rljax.sweep import aggregate, plots, runner
from rljax.sweep import study as study_lib
from rljax.runs.preemption import Stop


def parse_args(argv):
  parser = ArgumentParser(prog="rljax sweep", description=__doc__.splitlines()[0])
  parser.add_argument("study", help="a study file with get_study() (experiments/studies/*.py)")
  parser.add_argument("--root", default="runs/studies",
                      help="directory of all studies (default runs/studies)")
  parser.add_argument("--parallel", type=int, default=1,
                      help="runs at once (default 1; on 2 CPU cores more rarely pays off)")
  parser.add_argument("--print-commands", action="store_true",
                      help="print one shell line per missing run (cold starts first) and exit")
  parser.add_argument("--aggregate-only", action="store_true",
                      help="run nothing; aggregate the finished runs")
  parser.add_argument("--seeds", default=None, metavar="K,K,...",
                      help="only these of the study's seeds (e.g. to split a study across "
                      "machines, or a one-seed smoke run); the table covers them only")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="an extra config override for every run (e.g. train.steps=2)")
  args = parser.parse_args(argv)
  if args.parallel < 1:
    parser.error(f"--parallel must be >= 1, got {args.parallel}")
  extra = []
  for item in args.set:
    key, sep, value = item.partition("=")
    if not sep or not key:
      parser.error(f"--set expects KEY=VALUE, got {item!r}")
    extra.append((key.removeprefix("config."), value))
  args.extra = tuple(extra)
  return args


def _samples_per_round(run_dir: str) -> int | None:
  """What one sampling round of the run generated, from the config it ran with."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    rollout = json.load(f)["rollout"]
  return int(rollout["prompts_per_step"]) * int(rollout["group_size"])


def aggregate_study(study: study_lib.Study, specs, out_dir: str) -> dict:
  """Write runs.csv, summary.csv, results.md and curves.png for the finished runs of ``specs``."""
  records = aggregate.load_runs(specs)
  summaries = {(s.variant, s.seed): aggregate.run_summary(records[(s.variant, s.seed)],
                                                         runner.read_wall(s.run_dir),
                                                         _samples_per_round(s.run_dir))
               for s in specs if (s.variant, s.seed) in records}
  if not summaries:
    raise study_lib.StudyError(f"study {study.name!r} has no finished run to aggregate")
  per_run = [{"variant": v, "seed": k, **values} for (v, k), values in summaries.items()]
  rows = aggregate.summarize_study(study, summaries)
  paths = {"runs_csv": os.path.join(out_dir, "runs.csv"),
           "summary_csv": os.path.join(out_dir, "summary.csv"),
           "markdown": os.path.join(out_dir, "results.md"),
           "curves_png": os.path.join(out_dir, "curves.png")}
  aggregate.write_csv(paths["runs_csv"], per_run)
  aggregate.write_csv(paths["summary_csv"], rows)
  missing = [f"{s.variant}/seed{s.seed}" for s in specs if (s.variant, s.seed) not in summaries]
  with open(paths["markdown"], "w") as f:
    f.write(f"# Study `{study.name}`\n\n{study.description}\n\n" if study.description
            else f"# Study `{study.name}`\n\n")
    f.write(f"Base config `{study.config}`, seeds {list(study.seeds)}; finished runs "
            f"{len(summaries)}/{len(specs)}"
            + (f" (missing: {', '.join(missing)})" if missing else "") + ".\n\n")
    f.write(aggregate.markdown_table(study, rows))
    f.write("\n![curves](curves.png)\n")
  plots.plot_study(records, [v.name for v in study.variants], paths["curves_png"],
                   title=f"{study.name}: mean over seeds, 95% t-band")
  return paths


def main(argv) -> dict:
  args = parse_args(argv)
  study = study_lib.load_study(args.study)
  if args.seeds is not None:
    study = _with_seeds(study, args.seeds)
  config_path = study.config_path()
  specs = runner.plan_runs(study, args.root, args.extra)
  sft_jobs, train_jobs, states = runner.pending_jobs(
      specs, config_path, link_twins=not args.print_commands)
  if args.print_commands:
    for job in sft_jobs + train_jobs:
      print(runner.printable(job.argv))
    return {"commands": len(sft_jobs) + len(train_jobs)}
  counts = {s: sum(1 for v in states.values() if v == s) for s in ("finished", "partial", "new")}
  print(f"study {study.name}: {len(specs)} runs ({counts['finished']} finished, "
        f"{counts['partial']} to resume, {counts['new']} new) under "
        f"{runner.study_dir(args.root, study)}", flush=True)
  failed = []
  if not args.aggregate_only:
    _make_dir(runner.study_dir(args.root, study))
    env = runner.shared_cache_env(args.root)
    with runner.forwarding_signals():
      for result in runner.run_jobs(sft_jobs, args.parallel, log=_log, env=env):
        if result["returncode"]:
          failed.append(result)
      # A train run whose cold start failed would only fail again: run the others.
      bad_sft = {f["job"].sft_dir for f in failed}
      train_jobs = [j for j in train_jobs if j.sft_dir is None or j.sft_dir not in bad_sft]
      failed += [r for r in runner.run_jobs(train_jobs, args.parallel, log=_log, env=env)
                 if r["returncode"]]
      _stop_if_signalled()
  ran = [] if args.aggregate_only else [j.run for j in train_jobs]
  paths = aggregate_study(study, specs, os.path.join(runner.study_dir(args.root, study),
                                                     "results"))
  summary = {"study": study.name, "ran": ran, "failed": [f["label"] for f in failed], **paths}
  print(json.dumps(summary))
  if failed:
    # Not the study's mistake: the runs' own (their logs say why), exit status 1.
    raise SystemExit(f"error: {len(failed)} job(s) failed; logs: "
                     + ", ".join(f["log"] for f in failed))
  return summary


def _make_dir(path: str) -> None:
  """The study's directory, or one line saying why it cannot be (before any run starts)."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise study_lib.StudyError(f"cannot create the study directory {path!r}: {e.strerror} "
                               f"({e.filename}); choose another --root") from None


def _stop_if_signalled() -> None:
  """After SIGTERM/SIGINT (forwarded to the runs, which ended): one line and 128 + signal."""
  signum = runner.stop_signal()
  if signum is not None:
    name = signal.Signals(signum).name
    raise Stop(f"sweep stopped by {name}: forwarded to its runs, which stopped (SIGTERM: each at "
               "a step boundary, with a checkpoint); no process is left. Rerun the same command "
               "to resume", 128 + signum)


def _with_seeds(study: study_lib.Study, text: str) -> study_lib.Study:
  """``study`` restricted to the comma-separated ``text`` seeds, which must be among its own."""
  try:
    seeds = tuple(int(k) for k in text.split(","))
  except ValueError:
    raise study_lib.StudyError(
        f"--seeds expects comma-separated integers, got {text!r}") from None
  unknown = [k for k in seeds if k not in study.seeds]
  if unknown:
    raise study_lib.StudyError(f"--seeds {unknown} are not seeds of study {study.name!r}; its "
                               f"seeds: {list(study.seeds)}")
  return dataclasses.replace(study, seeds=seeds)


def _log(text: str) -> None:
  print(text, flush=True)

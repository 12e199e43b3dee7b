"""The main job's update with ``algo.old_logp='recompute'`` against ``'sampler'``, in one process.

  python benchmarks/old_logp.py [--model hf:DIR] [--steps 16]

``configs/jobs/main_600.py`` as ``rljax train`` runs it (DAPO with dynamic sampling, 16 x 8 rows, 24
new tokens, ``algo.minibatches=4``, one JAX device per core), its policy from ``--model``: ``tiny``
(random, the main job's architecture) or ``hf:DIR``, e.g. the main job's SFT cold start (an
``rljax sweep experiments/main_job_seeds.py`` run keeps it in ``<root>/_sft/<hash>``), whose
completions have the main job's lengths. Each step samples one batch with the loop's own
``collect_batch`` (the recompute side's weights), then times the update of each side on it, the
two in alternating order: ``fns.score`` + ``fns.train_step`` and the metrics to the host, what
``rljax train`` logs as ``sec_update`` less the weight publish. Each side keeps its own train
state. Prints the median update seconds of each side over the steps after a warm-up (compile)
step, their ratio and the median of the per-step ratios; on a loaded machine only the ratios
mean anything.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rljax.config import loader as config_loader  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax.train import build, loop  # noqa: E402
from rljax.runs.metrics import summarize  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("recompute", "sampler")


def main_config(model: str, run_dir: str, old_logp: str):
  """``configs/jobs/main_600.py`` with its policy from ``model`` (no SFT cold start is trained)."""
  overrides = [("model.source", model), ("train.run_dir", run_dir), ("train.progress", "false"),
               ("algo.old_logp", old_logp), ("sft.stop_match", "0.0")]
  return config_loader.load_config(os.path.join(ROOT, "configs", "jobs", "main_600.py"), overrides)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", default="tiny", help="tiny | hf:DIR")
  parser.add_argument("--steps", type=int, default=16, help="timed steps after the warm-up")
  args = parser.parse_args()
  run_dir = tempfile.mkdtemp(prefix="old_logp_bench_")
  configs = {side: main_config(args.model, os.path.join(run_dir, side), side) for side in SIDES}
  mesh_lib.start_cpu_devices(configs["recompute"])
  run = build.build_run(configs["recompute"])
  sides = {"recompute": {"state": run.state, "fns": run.fns, "hp": run.algo.hparams}}
  config = configs["sampler"]
  algo = resolve(config)
  _, params = build.load_policy(config, run.generator.tokenizer)
  state, fns, _ = build.sharded_state_and_fns(config, run.model_cfg, params, run.mesh, algo)
  sides["sampler"] = {"state": state, "fns": fns, "hp": algo.hparams}
  print(f"# jax {jax.__version__}; {len(os.sched_getaffinity(0))} CPU threads, "
        f"{len(jax.devices())} JAX device(s); model {args.model}, "
        f"{run.model_cfg.num_params():,} params; algo.minibatches={algo.minibatches}, "
        f"algo.epochs={algo.epochs}")

  def update(side, batch):
    s = sides[side]
    t0 = time.perf_counter()
    scored, score_metrics = s["fns"].score(s["state"], loop.to_device(batch, run.mesh), s["hp"])
    s["state"], metrics = s["fns"].train_step(s["state"], scored, s["hp"])
    out = summarize(jax.device_get({**score_metrics, **metrics}))
    return time.perf_counter() - t0, out

  seconds = {side: [] for side in SIDES}
  for step in range(args.steps + 1):
    batch, info = loop.collect_batch(run, step)
    run.state = sides["recompute"]["state"]  # the sampler's weights: the recompute side's
    order = SIDES if step % 2 == 0 else SIDES[::-1]
    line = [f"step {step}: len_mean {info['len_mean']:.1f}"]
    for side in order:
      sec, metrics = update(side, batch)
      if step:  # step 0 compiles
        seconds[side].append(sec)
      line.append(f"{side} {sec:.3f} s (entropy {metrics['entropy']:.3f}, "
                  f"clip_frac_high {metrics['clip_frac_high']:.3f})")
    run.state = sides["recompute"]["state"]
    print("; ".join(line))
    sys.stdout.flush()
  med = {side: statistics.median(seconds[side]) for side in SIDES}
  ratios = [b / a for a, b in zip(seconds["recompute"], seconds["sampler"])]
  shutil.rmtree(run_dir, ignore_errors=True)  # the runs' logs and configs: nothing to keep
  print(f"median update over {args.steps} steps: recompute {med['recompute']:.3f} s, sampler "
        f"{med['sampler']:.3f} s; sampler / recompute = {med['sampler'] / med['recompute']:.3f} "
        f"(per step: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-"
        f"{max(ratios):.3f})")


if __name__ == "__main__":
  main()

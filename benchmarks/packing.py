"""Sequence packing (``model.pack``) against padded rows: the update and scoring on long-tailed
completions, tokens/s and compiled memory, in one process.

Workload: ``B`` rows, prompts of ``P/4``-``P`` tokens (left-padded to ``P = --prompt``, 64),
completion lengths at the
quantiles of a log-normal (sigma 1) with mean 0.25 x ``T``, clipped to ``[1, T]``, as
in DAPO-style reasoning runs; a tiny Llama (``--hidden`` wide, ``--layers`` layers) so a 4k
step finishes in seconds on a CPU. Both sides run ``rljax.learner.step`` as ``rljax train``
builds it (GRPO, ``model.forward_tokens`` and ``model.parallel_chunks`` at their defaults, one
device) and differ only in ``model.pack``; scoring computes the old and the reference
log-probs (``algo.kl_placement=loss``, two minibatches so the old log-probs are needed).

Reported per maximum length ``T``: the median seconds of ``--runs`` calls after a warm-up (sides
interleaved call by call), tokens/s (valid prompt + completion tokens / s) and the ratio
packed / padded; the packed layout's fill (tokens / slots of the used chunks) and chunks used;
the compiled train step's temporary memory (XLA's memory analysis). With ``--compile``, a
second table: the CPU seconds (and wall seconds) to trace and compile scoring + update on each
side, after an untimed
compilation of both (the process's first pays one-time costs; the packed
program's layout, gathers and chunk scan compile slower), the seconds a step (scoring + update)
saves packed, and the steps after which packing has paid for its longer compilation
(extra compile / saving per step; "never" where packed is not faster). Usage::

  python benchmarks/packing.py                       # T = 1024 and 4096, B = 16
  python benchmarks/packing.py --max-new 4096 --rows 8 --runs 2
  python benchmarks/packing.py --max-new 64,192,448 --compile    # rows of 128, 256, 512
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rljax.config import loader as config_loader  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.models import transformer, tiny_config# noqa: E402
from rljax.rollout.sampler import Rollout  # noqa: E402
from rljax.train import build  # noqa: E402
from rljax.learner import packing, step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 64


def _parse(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--max-new", default="1024,4096", help="T, comma-separated")
  ap.add_argument("--rows", type=int, default=16, help="B")
  ap.add_argument("--prompt", type=int, default=64, help="P, the prompt bucket")
  ap.add_argument("--hidden", type=int, default=64)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--compile", action="store_true",
                  help="also report compile seconds and the steps that repay them")
  return ap.parse_args(argv)


def lognormal_lengths(rows: int, max_new: int, rng, mean_frac: float = 0.25,
                      sigma: float = 1.0) -> np.ndarray:
  """Completion lengths at the ``rows`` quantiles ``(i + 1/2) / rows`` of a log-normal with mean
  ``mean_frac x max_new`` (``E[exp(N(mu, s^2))] = exp(mu + s^2 / 2)``), clipped to
  ``[1, max_new]``, in random order: a small batch still has the distribution's mean and tail."""
  mu = np.log(mean_frac * max_new) - sigma ** 2 / 2
  z = np.array([statistics.NormalDist().inv_cdf((i + 0.5) / rows) for i in range(rows)])
  return rng.permutation(np.clip(np.round(np.exp(mu + sigma * z)), 1, max_new).astype(np.int32))


def long_tailed_rollout(rows: int, max_new: int, seed: int, prompt_width: int = 64) -> Rollout:
  """Prompts of ``prompt_width / 4`` to ``prompt_width`` tokens left-padded to ``prompt_width``,
  completions log-normal with mean 0.25 x max_new."""
  rng = np.random.default_rng(seed)
  comp = lognormal_lengths(rows, max_new, rng)
  prompt = rng.integers(max(1, prompt_width // 4), prompt_width + 1, rows)
  tokens = rng.integers(3, VOCAB, (rows, prompt_width + max_new)).astype(np.int32)
  prompt_mask = (np.arange(prompt_width)[None] >= prompt_width - prompt[:, None]).astype(np.int32)
  mask = (np.arange(max_new)[None] < comp[:, None]).astype(np.int32)
  zeros = np.zeros((rows, max_new), np.float32)
  rewards = rng.integers(0, 2, rows).astype(np.float32)
  return Rollout(prompt_tokens=tokens[:, :prompt_width], prompt_mask=prompt_mask,
                 tokens=tokens[:, prompt_width:], mask=mask, sampler_logp=zeros, draw_logp=zeros,
                 lengths=comp, truncated=comp >= max_new, rewards=rewards, correct=rewards > 0,
                 row_valid=np.ones(rows, np.float32))


def _fns(pack: bool, args, max_new: int):
  overrides = {"model.hidden_size": str(args.hidden), "model.intermediate_size":
               str(2 * args.hidden), "model.num_layers": str(args.layers), "model.num_heads": "2",
               "model.num_kv_heads": "2", "rollout.max_new_tokens": str(max_new),
               "rollout.prompts_per_step": str(args.rows // 4), "rollout.group_size": "4",
               "data.prompt_bucket": str(args.prompt), "algo.kl_placement": "loss",
               "algo.minibatches": "2", "model.pack": str(pack)}
  config = config_loader.load_config(os.path.join(ROOT, "configs", "algos", "grpo.py"),
                                     list(overrides.items()))
  model_cfg = tiny_config(config.model, VOCAB)
  algo = resolve(config)
  _, make = build.abstract_state(config, model_cfg, algo)
  spec = build.step_spec(config, model_cfg, algo)
  fns = step_lib.step_fns(spec)
  return jax.jit(fns.score), jax.jit(fns.train_step), make(transformer.init_params(model_cfg)), \
      algo.hparams, spec


def auto_chunks(args, max_new: int) -> dict:
  """The packed layout's chunks of scoring (the batch) and of the update (a minibatch), and
  whether ``model.pack='auto'`` packs each (``StepSpec.pack_shape``)."""
  spec = _fns("auto", args, max_new)[-1]
  width, rows = args.prompt + max_new, args.rows
  minibatch = rows // spec.algo.minibatches
  out = {}
  for phase, n, at_least in (("score", rows, 1), ("train", minibatch, spec.algo.micro_batches)):
    chunks = packing.chunk_shape(n, width, spec.pack_rows(n, width, at_least))[0]
    out[phase] = (chunks, spec.pack_shape(n, width, at_least) is not None)
  return out


def _timed(fn):
  """``(fn(), wall seconds, this process's CPU seconds)``, the result ready. On a shared
  machine the CPU seconds of a compilation (mostly one thread) vary less than its wall time."""
  t0, c0 = time.perf_counter(), time.process_time()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - t0, time.process_time() - c0


def _seconds(fn) -> float:
  return _timed(fn)[1]


def warm_up(args, max_new: int) -> None:
  """Compiles both sides once, untimed: the process's first compilations pay one-time costs
  that would otherwise fall on whichever side compiles first."""
  rollout = long_tailed_rollout(args.rows, max_new, args.seed, args.prompt)
  for pack in (False, True):
    score, train, state, hp, _ = _fns(pack, args, max_new)
    batch, _ = score(state, rollout, hp)
    train.lower(state, batch, hp).compile()


def measure(args, max_new: int) -> dict:
  rollout = long_tailed_rollout(args.rows, max_new, args.seed, args.prompt)
  tokens = int(rollout.prompt_mask.sum() + rollout.mask.sum())
  sides = {}
  for pack in (False, True):
    score, train, state, hp, _ = _fns(pack, args, max_new)
    # Trace + compile each program once, timed (what a run's first step pays), and call the
    # compiled executables from then on.
    score_c, *score_compile = _timed(lambda: score.lower(state, rollout, hp).compile())
    batch, metrics = score_c(state, rollout, hp)
    train_c, *train_compile = _timed(lambda: train.lower(state, batch, hp).compile())
    sides[pack] = dict(score=lambda s=score_c, st=state, h=hp: s(st, rollout, h),
                       train=lambda t=train_c, st=state, b=batch, h=hp: t(st, b, h),
                       temp=train_c.memory_analysis().temp_size_in_bytes, metrics=metrics,
                       compile=score_compile[0] + train_compile[0],
                       compile_cpu=score_compile[1] + train_compile[1])
    jax.block_until_ready(sides[pack]["train"]())  # warm up
  times = {(pack, phase): [] for pack in sides for phase in ("score", "train")}
  for _ in range(args.runs):
    for pack in sides:
      for phase in ("score", "train"):
        times[(pack, phase)].append(_seconds(sides[pack][phase]))
  med = {k: statistics.median(v) for k, v in times.items()}
  fill = sides[True]["metrics"]["pack/fill"]
  return dict(T=max_new, width=args.prompt + max_new, rows=args.rows, tokens=tokens,
              completion_mean_frac=float(rollout.mask.sum()) / (args.rows * max_new),
              fill=float(fill[0]) / float(fill[1]),
              **{f"{phase}_{side}_s": med[(pack, phase)] for pack, side in ((False, "padded"),
                                                                              (True, "packed"))
                 for phase in ("score", "train")},
              **{f"{phase}_ratio": med[(False, phase)] / med[(True, phase)]
                 for phase in ("score", "train")},
              compile_padded_s=sides[False]["compile"], compile_packed_s=sides[True]["compile"],
              compile_cpu_padded_s=sides[False]["compile_cpu"],
              compile_cpu_packed_s=sides[True]["compile_cpu"],
              temp_padded_mib=sides[False]["temp"] / 2 ** 20,
              temp_packed_mib=sides[True]["temp"] / 2 ** 20)


def payback_steps(r: dict) -> float:
  """Steps (one scoring + one update each) after which the packed run, compiled slower, has
  caught up with the padded one: extra compile CPU seconds / seconds saved a step; ``inf``
  where the packed step is not faster (0 where it also compiles no slower)."""
  saved = (r["score_padded_s"] + r["train_padded_s"]) - (r["score_packed_s"] + r["train_packed_s"])
  extra = r["compile_cpu_packed_s"] - r["compile_cpu_padded_s"]
  if saved <= 0:
    return float("inf")
  return max(0.0, extra) / saved


def main(argv=None):
  args = _parse(argv)
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, B={args.rows}, P={args.prompt}, "
        f"hidden={args.hidden}, layers={args.layers}, runs={args.runs}")
  print("| T | completion mean / T | fill | update padded s | packed s | update x | "
        "scoring padded s | packed s | scoring x | update temp MiB padded | packed |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  results = []
  if args.compile:
    warm_up(args, int(args.max_new.split(",")[0]))
  for max_new in map(int, args.max_new.split(",")):
    r = measure(args, max_new)
    results.append(r)
    tok = r["tokens"]
    print(f"| {r['T']} | {r['completion_mean_frac']:.3f} | {r['fill']:.3f} | "
          f"{r['train_padded_s']:.3f} ({tok / r['train_padded_s']:.0f} tok/s) | "
          f"{r['train_packed_s']:.3f} ({tok / r['train_packed_s']:.0f} tok/s) | "
          f"**{r['train_ratio']:.2f}** | {r['score_padded_s']:.3f} | {r['score_packed_s']:.3f} | "
          f"**{r['score_ratio']:.2f}** | {r['temp_padded_mib']:.1f} | {r['temp_packed_mib']:.1f} |",
          flush=True)
  if args.compile:
    print("\n| row width P + T | chunks scoring / update (auto packs) | compile CPU s padded "
          "| packed | packed / padded | compile wall s padded | packed | step padded s | "
          "packed s | saved a step s | steps to repay |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
      step = {side: r[f"score_{side}_s"] + r[f"train_{side}_s"] for side in ("padded", "packed")}
      steps = payback_steps(r)
      auto = auto_chunks(args, r["T"])
      chunks = " / ".join(f"{c}{' (yes)' if on else ''}" for c, on in auto.values())
      print(f"| {r['width']} | {chunks} | {r['compile_cpu_padded_s']:.1f} | "
            f"{r['compile_cpu_packed_s']:.1f} | "
            f"{r['compile_cpu_packed_s'] / r['compile_cpu_padded_s']:.2f} | "
            f"{r['compile_padded_s']:.1f} | {r['compile_packed_s']:.1f} | {step['padded']:.3f} | "
            f"{step['packed']:.3f} | {step['padded'] - step['packed']:.3f} | "
            f"{'never' if steps == float('inf') else f'{steps:.0f}'} |", flush=True)


if __name__ == "__main__":
  main()

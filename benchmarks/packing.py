"""Sequence packing (``model.pack``) against padded rows: the update and scoring on long-tailed
completions, tokens/s and compiled memory, in one process.

Workload: ``B`` rows, prompts of 16-64 tokens (left-padded to 64), completion lengths at the
quantiles of a log-normal (sigma 1) with mean 0.25 x ``T``, clipped to ``[1, T]``, as
in DAPO-style reasoning runs; a tiny Llama (``--hidden`` wide, ``--layers`` layers) so a 4k
step finishes in seconds on a CPU. Both sides run ``rljax.train.step`` as ``rljax train``
builds it (GRPO, ``model.forward_tokens`` and ``model.parallel_chunks`` at their defaults, one
device) and differ only in ``model.pack``; scoring computes the old and the reference
log-probs (``algo.kl_placement=loss``, two minibatches so the old log-probs are needed).

Reported per maximum length ``T``: the median seconds of ``--runs`` calls after a warm-up (sides
interleaved call by call), tokens/s (valid prompt + completion tokens / s) and the ratio
packed / padded; the packed layout's fill (tokens / slots of the used chunks) and chunks used;
the compiled train step's temporary memory (XLA's memory analysis). Usage::

  python benchmarks/packing.py                       # T = 1024 and 4096, B = 16
  python benchmarks/packing.py --max-new 4096 --rows 8 --runs 2
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

from rljax import config_loader  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.models import llama, tiny_config  # noqa: E402
from rljax.rollout.sampler import Rollout  # noqa: E402
from rljax.train import build, step as step_lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT, VOCAB = 64, 64


def _parse(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--max-new", default="1024,4096", help="T, comma-separated")
  ap.add_argument("--rows", type=int, default=16, help="B")
  ap.add_argument("--hidden", type=int, default=64)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--seed", type=int, default=0)
  return ap.parse_args(argv)


def lognormal_lengths(rows: int, max_new: int, rng, mean_frac: float = 0.25,
                      sigma: float = 1.0) -> np.ndarray:
  """Completion lengths at the ``rows`` quantiles ``(i + 1/2) / rows`` of a log-normal with mean
  ``mean_frac x max_new`` (``E[exp(N(mu, s^2))] = exp(mu + s^2 / 2)``), clipped to
  ``[1, max_new]``, in random order: a small batch still has the distribution's mean and tail."""
  mu = np.log(mean_frac * max_new) - sigma ** 2 / 2
  z = np.array([statistics.NormalDist().inv_cdf((i + 0.5) / rows) for i in range(rows)])
  return rng.permutation(np.clip(np.round(np.exp(mu + sigma * z)), 1, max_new).astype(np.int32))


def long_tailed_rollout(rows: int, max_new: int, seed: int) -> Rollout:
  """Left-padded prompts of 16-64 tokens, completions log-normal with mean 0.25 x max_new."""
  rng = np.random.default_rng(seed)
  comp = lognormal_lengths(rows, max_new, rng)
  prompt = rng.integers(16, PROMPT + 1, rows)
  tokens = rng.integers(3, VOCAB, (rows, PROMPT + max_new)).astype(np.int32)
  prompt_mask = (np.arange(PROMPT)[None] >= PROMPT - prompt[:, None]).astype(np.int32)
  mask = (np.arange(max_new)[None] < comp[:, None]).astype(np.int32)
  zeros = np.zeros((rows, max_new), np.float32)
  rewards = rng.integers(0, 2, rows).astype(np.float32)
  return Rollout(prompt_tokens=tokens[:, :PROMPT], prompt_mask=prompt_mask,
                 tokens=tokens[:, PROMPT:], mask=mask, sampler_logp=zeros, draw_logp=zeros,
                 lengths=comp, truncated=comp >= max_new, rewards=rewards, correct=rewards > 0,
                 row_valid=np.ones(rows, np.float32))


def _fns(pack: bool, args, max_new: int):
  overrides = {"model.hidden_size": str(args.hidden), "model.intermediate_size":
               str(2 * args.hidden), "model.num_layers": str(args.layers), "model.num_heads": "2",
               "model.num_kv_heads": "2", "rollout.max_new_tokens": str(max_new),
               "rollout.prompts_per_step": str(args.rows // 4), "rollout.group_size": "4",
               "data.prompt_bucket": str(PROMPT), "algo.kl_placement": "loss",
               "algo.minibatches": "2", "model.pack": str(pack)}
  config = config_loader.load_config(os.path.join(ROOT, "configs", "grpo.py"),
                                     list(overrides.items()))
  model_cfg = tiny_config(config.model, VOCAB)
  algo = resolve(config)
  _, make = build.abstract_state(config, model_cfg, algo)
  fns = step_lib.step_fns(build.step_spec(config, model_cfg, algo))
  return jax.jit(fns.score), jax.jit(fns.train_step), make(llama.init_params(model_cfg)), \
      algo.hparams


def _seconds(fn) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def measure(args, max_new: int) -> dict:
  rollout = long_tailed_rollout(args.rows, max_new, args.seed)
  tokens = int(rollout.prompt_mask.sum() + rollout.mask.sum())
  sides = {}
  for pack in (False, True):
    score, train, state, hp = _fns(pack, args, max_new)
    batch, metrics = score(state, rollout, hp)
    memory = train.lower(state, batch, hp).compile().memory_analysis()
    sides[pack] = dict(score=lambda s=score, st=state, h=hp: s(st, rollout, h),
                       train=lambda t=train, st=state, b=batch, h=hp: t(st, b, h),
                       temp=memory.temp_size_in_bytes, metrics=metrics)
    jax.block_until_ready(sides[pack]["train"]())  # compile and warm up
  times = {(pack, phase): [] for pack in sides for phase in ("score", "train")}
  for _ in range(args.runs):
    for pack in sides:
      for phase in ("score", "train"):
        times[(pack, phase)].append(_seconds(sides[pack][phase]))
  med = {k: statistics.median(v) for k, v in times.items()}
  fill = sides[True]["metrics"]["pack/fill"]
  return dict(T=max_new, rows=args.rows, tokens=tokens,
              completion_mean_frac=float(rollout.mask.sum()) / (args.rows * max_new),
              fill=float(fill[0]) / float(fill[1]),
              **{f"{phase}_{side}_s": med[(pack, phase)] for pack, side in ((False, "padded"),
                                                                              (True, "packed"))
                 for phase in ("score", "train")},
              **{f"{phase}_ratio": med[(False, phase)] / med[(True, phase)]
                 for phase in ("score", "train")},
              temp_padded_mib=sides[False]["temp"] / 2 ** 20,
              temp_packed_mib=sides[True]["temp"] / 2 ** 20)


def main(argv=None):
  args = _parse(argv)
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, B={args.rows}, "
        f"hidden={args.hidden}, layers={args.layers}, runs={args.runs}")
  print("| T | completion mean / T | fill | update padded s | packed s | update x | "
        "scoring padded s | packed s | scoring x | update temp MiB padded | packed |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for max_new in map(int, args.max_new.split(",")):
    r = measure(args, max_new)
    tok = r["tokens"]
    print(f"| {r['T']} | {r['completion_mean_frac']:.3f} | {r['fill']:.3f} | "
          f"{r['train_padded_s']:.3f} ({tok / r['train_padded_s']:.0f} tok/s) | "
          f"{r['train_packed_s']:.3f} ({tok / r['train_packed_s']:.0f} tok/s) | "
          f"**{r['train_ratio']:.2f}** | {r['score_padded_s']:.3f} | {r['score_packed_s']:.3f} | "
          f"**{r['score_ratio']:.2f}** | {r['temp_padded_mib']:.1f} | {r['temp_packed_mib']:.1f} |",
          flush=True)


if __name__ == "__main__":
  main()

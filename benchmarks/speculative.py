"""Speculative decoding against the plain sampler on the long tail: few rows, many new tokens.

Workload: ``--rows`` prompts of 32 random tokens (vocabulary 64), one completion each, exactly
``--new-tokens`` tokens per row (no stop token), random-weight Llama models (``bench_common``).
Sides, all in this process, compiled first and then timed interleaved run by run: the plain
sampler (``sample``) and ``sample(..., draft=Draft(kind, k))`` for each draft kind and ``k``
(``rljax.rollout.speculative``), greedy and sampled (temperature 1).

Reported per model, mode and side: tokens/s (median of ``--runs``), its ratio to the plain
sampler's (wall time, and the process's CPU time: on a shared machine the steadier of the two), the acceptance rate (drafted tokens accepted / drafted) and the mean tokens emitted
per verification forward (accepted + 1, cut at the budget).

Random-weight models rarely repeat themselves when sampled, so prompt lookup finds little to
propose and its acceptance is near 0 there; greedy decoding of a random model falls into loops,
which prompt lookup predicts. The figures say what the hardware gives at a given acceptance, not
what a trained policy's rollouts would accept.

``--workload main``: the main job's rollouts (configs/jobs/main.py) instead: a trained policy
(``--policies NAME=SOURCE,...``, ``rljax.load`` sources: its SFT cold start ``hf:DIR``, an RL
run's checkpoint ``run:DIR``), ``--rows`` train prompts of embedded arithmetic level 0 (the
trainer's prompt encoding and bucket) with the job's group size, completion budget, temperature
and EOS stop; the same sides. Usage::

  PYTHONPATH=. python benchmarks/speculative.py                        # 1M, 6M; 4 rows x 256
  PYTHONPATH=. python benchmarks/speculative.py --models 50M --new-tokens 128 --runs 1
  PYTHONPATH=. python benchmarks/speculative.py --workload main --rows 32 \
      --policies cold=hf:runs/spec_main/_sft/HASH,rl=run:runs/spec_main/.../plain/seed0
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench_common import model_config  # noqa: E402
from rljax.models import transformer  # noqa: E402
from rljax.rollout import SamplingParams, sampler  # noqa: E402
from rljax.rollout.speculative import Draft  # noqa: E402

PROMPT, VOCAB = 32, 64


def _parse(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="1M,6M")
  ap.add_argument("--rows", type=int, default=4)
  ap.add_argument("--new-tokens", type=int, default=256)
  ap.add_argument("--drafts", default="ngram:4,ngram:8,layers:4",
                  help="KIND:K,...; 'layers' drafts with the first --draft-layers layers")
  ap.add_argument("--draft-layers", type=int, default=1)
  ap.add_argument("--ngram", type=int, default=3)
  ap.add_argument("--modes", default="greedy,sampled")
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--workload", choices=("long_tail", "main"), default="long_tail")
  ap.add_argument("--policies", default="",
                  help="--workload main: NAME=SOURCE,... (rljax.load sources)")
  return ap.parse_args(argv)


def main_job_workload(args):
  """``[(name, cfg, params, tokens, mask, {mode: SamplingParams}, group size)]``: the policies
  of ``--policies`` on ``--rows`` of the main job's train prompts."""
  from rljax.config.loader import load_config
  from rljax.data import make_task
  from rljax.api import load
  from rljax.rollout import left_pad
  job = load_config(os.path.join(ROOT, "configs", "jobs", "main.py"))
  task = make_task(job.data.source.split(":", 1)[1], job.data.difficulty)
  problems = [task.problem_at(args.seed, i) for i in range(args.rows)]
  out = []
  for spec in args.policies.split(","):
    if "=" not in spec:
      raise SystemExit(f"--policies: expected NAME=SOURCE, got {spec!r}")
    name, source = spec.split("=", 1)
    model = load(source, tokenizer="char")
    tok = model.tokenizer
    tokens, mask = left_pad([tok.encode_prompt(p.prompt) for p in problems],
                            job.data.prompt_bucket, tok.pad_id)
    modes = {mode: SamplingParams(greedy=mode == "greedy", temperature=job.rollout.temperature,
                                  max_new_tokens=job.rollout.max_new_tokens,
                                  stop_ids=(tok.eos_id,), pad_id=tok.pad_id)
             for mode in args.modes.split(",")}
    out.append((name, model.cfg, model.params, np.asarray(tokens), np.asarray(mask), modes,
                job.rollout.group_size))
  return out


def long_tail_workload(args):
  """The same list for the long tail: random-weight models, random prompts, no stop token."""
  rng = np.random.default_rng(args.seed)
  tokens = rng.integers(1, VOCAB, (args.rows, PROMPT)).astype(np.int32)
  mask = np.ones_like(tokens)
  out = []
  for name in args.models.split(","):
    cfg = model_config(name, VOCAB, max_positions=PROMPT + args.new_tokens + 64)
    modes = {mode: SamplingParams(greedy=mode == "greedy", max_new_tokens=args.new_tokens,
                                  stop_ids=())
             for mode in args.modes.split(",")}
    out.append((name, cfg, transformer.init_params(cfg, args.seed), tokens, mask, modes, 1))
  return out


def make_side(cfg, params, tokens, mask, sp, draft, group_size=1):
  """A compiled side: ``fn(i) -> (tokens, seconds, CPU seconds, accepted, verifies, rows that
  emitted a token)`` of a call with key i."""
  call = lambda i: sampler._sample_jit(params, tokens, mask, jax.random.key(i), cfg=cfg, sp=sp,
                                       group_size=group_size, draft=draft, with_stats=True)
  jax.block_until_ready(call(0))  # compile

  def fn(i):
    t0, c0 = time.perf_counter(), time.process_time()
    out, st = jax.block_until_ready(call(i))
    sec, cpu = time.perf_counter() - t0, time.process_time() - c0
    return (int(np.sum(out.lengths)), sec, cpu, int(st.get("accepted", 0)),
            int(st.get("verifies", 0)), int(np.sum(out.lengths > 0)))
  return fn


def main(argv=None):
  args = _parse(argv)
  drafts = []
  for spec in args.drafts.split(","):
    kind, k = spec.split(":")
    drafts.append(Draft(kind, tokens=int(k), ngram=args.ngram, layers=args.draft_layers))
  workload = (main_job_workload if args.workload == "main" else long_tail_workload)(args)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, workload {args.workload}, "
        f"rows {args.rows}, runs {args.runs}")
  print("| model | mode | side | tokens/s | vs plain | vs plain, CPU time | acceptance | "
        "tokens / verify |")
  print("|---|---|---|---|---|---|---|---|")
  for name, cfg, params, tokens, mask, modes, g in workload:
    for mode, sp in modes.items():
      sides = {"plain": (None, make_side(cfg, params, tokens, mask, sp, None, g))}
      for draft in drafts:
        if draft.kind == "layers" and draft.layers >= cfg.num_layers:
          continue
        name_d = f"{draft.kind} k={draft.tokens}" + (
            f" m={draft.layers}/{cfg.num_layers}" if draft.kind == "layers" else
            f" n={draft.ngram}")
        sides[name_d] = (draft, make_side(cfg, params, tokens, mask, sp, draft, g))
      results = {side: [] for side in sides}
      for i in range(args.runs):  # sides interleaved run by run
        for side, (_, fn) in sides.items():
          results[side].append(fn(i + 1))
      rate = lambda side: statistics.median(r[0] / r[1] for r in results[side])
      cpu_rate = lambda side: statistics.median(r[0] / r[2] for r in results[side])
      base, cpu_base = rate("plain"), cpu_rate("plain")
      for side, (draft, _) in sides.items():
        if draft is None:
          print(f"| {name} | {mode} | plain | {base:.0f} | 1.00x | 1.00x | | |", flush=True)
          continue
        runs = results[side]
        acc = np.mean([a / max(1, v * draft.tokens) for _, _, _, a, v, _ in runs])
        # Token 0 of each row comes from the prefill, the others from verifications.
        per = np.mean([(n - rows) / max(1, v) for n, _, _, _, v, rows in runs])
        print(f"| {name} | {mode} | {side} | {rate(side):.0f} | {rate(side) / base:.2f}x | "
              f"{cpu_rate(side) / cpu_base:.2f}x | {acc:.1%} | {per:.2f} |", flush=True)


if __name__ == "__main__":
  main()

"""Long-tailed rollouts: continuous batching against waves of rows, at the same slot budget ``S``.

Workload: ``B`` rows (``B / G`` prompts of 32 tokens, ``G`` completions each), completion lengths
drawn log-normal (sigma 1, mean 0.3 x ``T``, clipped to ``[1, T]``, so a few percent run to the
limit), as in DAPO-style reasoning runs. A benchmark-only stop rule ends row ``i`` at its drawn
length on every side (rljax: ``row_budget``; transformers: a per-row ``StoppingCriteria``; no stop
token), so all sides generate exactly the same tokens per row. Sampling at temperature 1.

Sides, each with at most ``S`` rows in flight:

- ``waves``: today's sampler (``sample`` without a slot budget) called on ``S`` rows at a time;
  each wave runs until its longest row ends.
- ``continuous``: one ``sample(..., max_concurrent_rows=S)`` call on all ``B`` rows.
- ``transformers``: ``generate`` in waves of ``S`` rows.

Reported: useful tokens/s (tokens of the drawn completions / wall time, prefill included; median
[min-max] of ``--runs`` runs after a warm-up, sides interleaved run by run) and slot utilisation
(useful tokens / token slots computed: a wave computes ``S`` slots per step until its longest
row ends; the continuous loop ``S`` per decode step plus each row's first token). Usage::

  python benchmarks/long_tail.py                                  # 1M and 6M, B=128, S=32, T=256
  python benchmarks/long_tail.py --models 50M --rows 32 --slots 8 --new-tokens 128 --runs 1
  python benchmarks/long_tail.py --devices 2     # rljax data parallel: one loop per CPU device
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="1M,6M")
  ap.add_argument("--rows", type=int, default=128, help="B")
  ap.add_argument("--slots", type=int, default=32, help="S, per device")
  ap.add_argument("--group", type=int, default=4, help="G")
  ap.add_argument("--new-tokens", type=int, default=256, help="T")
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--refill-rows", type=int, default=0, help="0: the sampler's default (S/8)")
  ap.add_argument("--devices", type=int, default=1, help="CPU devices for rljax (data parallel)")
  ap.add_argument("--no-hf", action="store_true")
  ap.add_argument("--seed", type=int, default=0)
  return ap.parse_args(argv)


if __name__ == "__main__":
  ARGS = _parse()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if ARGS.devices > 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={ARGS.devices}")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from bench_common import model_config  # noqa: E402
from rljax.models import transformer, save_hf# noqa: E402
from rljax.rollout import SamplingParams, sampler  # noqa: E402

PROMPT, VOCAB = 32, 64


def draw_lengths(rows: int, t_max: int, seed: int) -> np.ndarray:
  """Log-normal completion lengths, mean 0.3 * t_max before clipping to [1, t_max]."""
  sigma = 1.0
  mu = np.log(0.3 * t_max) - sigma ** 2 / 2
  x = np.random.default_rng(seed).lognormal(mu, sigma, rows)
  return np.clip(np.round(x), 1, t_max).astype(np.int32)


def _timed(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


class RljaxSide:
  """``continuous``: one call on all rows with ``max_concurrent_rows = S``; ``waves``: calls of
  today's sampler on ``S`` rows (``S / G`` prompts) at a time."""

  def __init__(self, cfg, params, tokens, mask, lengths, args, continuous: bool):
    self.sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, stop_ids=())
    self.params, self.group = params, args.group
    self.devices = args.devices
    wave_rows = args.rows if continuous else args.slots * args.devices
    per_call = wave_rows // args.group
    self.calls = [(tokens[i:i + per_call], mask[i:i + per_call],
                   lengths[i * args.group:(i + per_call) * args.group])
                  for i in range(0, tokens.shape[0], per_call)]
    engine = dict(max_concurrent_rows=args.slots if continuous else None,
                  refill_rows=args.refill_rows or None)
    local = lambda p, t, m, k, budget, axes=None: sampler._sample_impl(
        p, t, m, k, cfg=cfg, sp=self.sp, group_size=args.group, with_stats=True,
        row_budget=budget, shard_axes=axes, **engine)
    if args.devices > 1:  # one decode loop per device, S slots each
      from jax.sharding import PartitionSpec as P

      def sharded(p, t, m, k, budget):
        out, stats = local(p, t, m, k, budget, axes=("data",))
        return out, dict(slots=stats["slots"], computed=jax.lax.psum(stats["computed"], "data"))
      mesh = Mesh(np.array(jax.devices()[:args.devices]), ("data",))
      d = P("data")
      self.fn = jax.jit(jax.shard_map(sharded, mesh=mesh, in_specs=(P(), d, d, P(), d),
                                      out_specs=(d, P()), check_vma=False))
    else:
      self.fn = jax.jit(local)
    self.key = 0

  def __call__(self):
    useful = computed = 0
    for tokens, mask, budget in self.calls:
      self.key += 1
      out, stats = self.fn(self.params, tokens, mask, jax.random.key(self.key), budget)
      lengths = np.asarray(out.lengths)
      assert np.array_equal(lengths, budget), (lengths, budget)
      useful += int(lengths.sum())
      computed += int(stats["computed"])
    return useful, computed


class HFSide:
  """``generate`` in waves of ``S`` rows, each row ended at its drawn length."""

  def __init__(self, path, tokens, mask, lengths, args):
    import torch
    import transformers
    self.torch = torch
    self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    self.model.eval()
    self.new = args.new_tokens
    per_call = args.slots // args.group
    self.calls = []
    for i in range(0, tokens.shape[0], per_call):
      t = torch.tensor(np.repeat(tokens[i:i + per_call], args.group, 0), dtype=torch.long)
      m = torch.tensor(np.repeat(mask[i:i + per_call], args.group, 0), dtype=torch.long)
      budget = torch.tensor(lengths[i * args.group:(i + per_call) * args.group])
      self.calls.append((t, m, budget))

    class LengthStop(transformers.StoppingCriteria):
      def __init__(self, budget, prompt):
        self.budget, self.prompt = budget, prompt

      def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.prompt) >= self.budget

    self.stop = LengthStop

  def __call__(self):
    import transformers
    useful = computed = 0
    with self.torch.inference_mode():
      for t, m, budget in self.calls:
        out = self.model.generate(
            input_ids=t, attention_mask=m, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=self.new, eos_token_id=None, pad_token_id=0,
            stopping_criteria=transformers.StoppingCriteriaList([self.stop(budget, t.shape[1])]))
        steps = out.shape[1] - t.shape[1]
        assert steps == int(budget.max()), (steps, budget.max())
        useful += int(budget.sum())
        computed += steps * t.shape[0]
    return useful, computed


def main(args):
  import torch
  import transformers
  if args.rows % args.group or args.slots % args.group:
    raise SystemExit("--rows and --slots must be multiples of --group")
  print(f"# machine: {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at start; "
        f"jax {jax.__version__} on {args.devices} CPU device(s), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}")
  lengths = draw_lengths(args.rows, args.new_tokens, args.seed)
  print(f"# B={args.rows} rows ({args.rows // args.group} prompts x G={args.group}), S="
        f"{args.slots} slots, T={args.new_tokens}, prompt {PROMPT}; lengths: mean "
        f"{lengths.mean():.1f} ({lengths.mean() / args.new_tokens:.2f} T), median "
        f"{np.median(lengths):.0f}, {int((lengths == args.new_tokens).sum())} at T; tokens/s = "
        f"median [min-max] of {args.runs} runs")
  print("| model | params | side | useful tok/s | vs waves | slot utilisation | compile+warm s |")
  print("|---|---|---|---|---|---|---|")
  rng = np.random.default_rng(args.seed + 1)
  tokens = rng.integers(1, VOCAB, (args.rows // args.group, PROMPT)).astype(np.int32)
  mask = np.ones_like(tokens)
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.models.split(","):
      cfg = model_config(name, VOCAB)
      params = transformer.init_params(cfg, seed=0)
      sides = {}
      for label, cont in (("waves", False), ("continuous", True)):
        sides[label] = RljaxSide(cfg, params, tokens, mask, lengths, args, cont)
      if not args.no_hf:
        path = os.path.join(tmp, name)
        save_hf(path, cfg, params)
        sides["transformers"] = HFSide(path, tokens, mask, lengths, args)
      warm, util = {}, {}
      for label, side in sides.items():
        t0 = time.perf_counter()
        useful, computed = side()
        warm[label], util[label] = time.perf_counter() - t0, useful / computed
      times = {label: [] for label in sides}
      for _ in range(args.runs):
        for label, side in sides.items():
          times[label].append(_timed(side))
      useful = int(lengths.sum())
      base = statistics.median(useful / t for t in times["waves"])
      for label in sides:
        tps = sorted(useful / t for t in times[label])
        med = statistics.median(tps)
        print(f"| {name} | {cfg.num_params() / 1e6:.1f}M | {label} | {med:,.0f} "
              f"[{tps[0]:,.0f}-{tps[-1]:,.0f}] | {med / base:.2f}x | {100 * util[label]:.1f}% | "
              f"{warm[label]:.1f} |", flush=True)


if __name__ == "__main__":
  main(ARGS)

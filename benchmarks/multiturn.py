"""Multi-turn rollouts with slow tools: continuous batching across turns against the
turn-synchronous driver, in one process (``env.engine``, docs/multiturn.md).

Workload: ``B`` rows (``B / G`` prompts, ``G`` episodes each) of a random-init Llama on the char
tokenizer, sampled at temperature 1, so a turn ends at a stop id (EOS or the tool-call close
``>``) after a geometric number of tokens, or at ``--turn-tokens``. Every turn is answered by
``slow_tool``, an environment whose step sleeps a random 0 to ``--latency-ms`` ms in its worker
process (uniform, drawn from the turn's text: the same for both engines when they draw the same
turn) and answers a short observation; an episode ends after a number of turns drawn from its
prompt in ``[1, --turns]`` (or at ``--max-tokens``).

Sides, with the same model, problems, worker processes (``--workers``) and limits:

- ``turn_sync``: ``run_episodes`` around the all-rows sampler: each turn one sampler call over
  the live rows (they re-prefill their trajectories), run until its longest row ends, then every
  row's step, waited for together.
- ``continuous``: ``run_async_episodes`` with ``--slots`` lanes: a row whose turn ends steps
  while the others decode, and re-enters with its cache kept.

Reported per side: useful tokens/s (policy tokens kept in the record / wall time of the whole
rollout, resets included; median and range of ``--runs`` runs of the same episodes after
``--warmups`` runs that compiled their shapes, sides alternated)
and slot utilisation (useful tokens / token slots the sampler computed: a turn-synchronous call
computes every row until its longest one ends, the continuous engine every lane of every
decode step and ``refill_rows`` first draws per admission of queued rows). Usage::

  python benchmarks/multiturn.py                          # 1M model, B=64, S=16, 0-200 ms tools
  python benchmarks/multiturn.py --prompts 64             # B=256: decode-bound, not tool-bound
  python benchmarks/multiturn.py --latency-ms 0 --runs 1  # no tool latency: decode only

At B = 64 one episode's tools alone (``EngineStats.tool_path_s``, ``--verbose``) take about half
the turn-synchronous driver's wall time: that workload measures latency hiding; B = 256 (an RL
step's batch size) measures the engine's decode throughput as well.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rljax.envs import ENVS, Environment, StepResult, register_env  # noqa: E402

SLOW_TOOL = "slow_tool"


if SLOW_TOOL not in ENVS:
  @register_env(SLOW_TOOL)  # module level: the forked workers unpickle it by reference
  class SlowTool(Environment):
    """Every step sleeps a random 0 .. ``latency_ms`` ms (the tool's latency, drawn from the
    turn's text) and answers ``' ok:'``; the episode ends after ``1 + crc(prompt) % max_turns``
    turns."""
    latency_ms = 200.0

    def reset(self, problem):
      self.turns_left = 1 + zlib.crc32(problem.prompt.encode()) % self.max_turns
      return problem.prompt

    def step(self, action):
      draw = zlib.crc32(f"{self.turns_left}|{action}".encode()) / 2**32
      time.sleep(draw * self.latency_ms / 1000)
      self.turns_left -= 1
      if self.turns_left <= 0:
        return StepResult("", 1.0, True, {"correct": True})
      return StepResult(" ok:", 0.0, False, {})


def _parse(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="1M")
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--group", type=int, default=4, help="G")
  ap.add_argument("--slots", type=int, default=16, help="S, the continuous engine's lanes")
  ap.add_argument("--turns", type=int, default=4, help="env.max_turns")
  ap.add_argument("--turn-tokens", type=int, default=48, help="rollout.max_new_tokens")
  ap.add_argument("--max-tokens", type=int, default=192, help="env.max_tokens")
  ap.add_argument("--latency-ms", type=float, default=200.0, help="tool latency: 0 .. this")
  ap.add_argument("--refill-rows", type=int, default=0, help="continuous: 0 = S/8")
  ap.add_argument("--workers", type=int, default=32, help="environment worker processes")
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--warmups", type=int, default=4,
                  help="runs first, not counted: the continuous engine's shapes (lane widths, "
                  "spans) depend on arrival order, so one run may not compile them all")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--verbose", action="store_true", help="print the engine's counters")
  return ap.parse_args(argv)


def main(argv=None):
  args = _parse(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import numpy as np

  from bench_common import model_config
  from rljax.data.tasks import Problem
  from rljax.data.tokenizer import CharTokenizer
  from rljax.envs.async_turns import EngineStats, run_async_episodes
  from rljax.envs.episodes import EnvSettings, run_episodes
  from rljax.models import transformer
  from rljax.rollout import SamplingParams, sampler

  SlowTool.latency_ms = args.latency_ms  # before the workers fork: they inherit it
  tok = CharTokenizer()
  cfg = model_config(args.model, tok.vocab_size)
  params = transformer.init_params(cfg, seed=args.seed)
  problems = [Problem(prompt=f"task {i}:", answer="") for i in range(args.prompts)]
  sp = SamplingParams(temperature=1.0, max_new_tokens=args.turn_tokens, stop_ids=(tok.eos_id,),
                      pad_id=tok.pad_id)
  settings = EnvSettings(name=SLOW_TOOL, max_turns=args.turns, max_tokens=args.max_tokens,
                         timeout_s=60.0, workers=args.workers)
  common = dict(tokenizer=tok, settings=settings, sampling=sp, group_size=args.group,
                prompt_bucket=16)

  def turn_sync(key):
    computed = [0]

    def generate(tokens, mask, k, sp_, g):
      out, stats = sampler._sample_jit(params, tokens, mask, k, cfg=cfg, sp=sp_, group_size=g,
                                       with_stats=True, max_concurrent_rows=None,
                                       kv_cache_bytes=None, dtype=None, refill_rows=None)
      computed[0] += int(stats["computed"])
      return jax.tree.map(np.asarray, out)
    result = run_episodes(problems, key, generate=generate, **common)
    return result, computed[0]

  def continuous(key):
    stats = EngineStats()
    result = run_async_episodes(problems, key, cfg=cfg, params=params, slots=args.slots,
                                     refill_rows=args.refill_rows, stats=stats, **common)
    if args.verbose:
      print(f"    {stats}")
    return result, stats.computed

  sides = {"turn_sync": turn_sync, "continuous": continuous}
  rows = {name: [] for name in sides}
  print(f"{args.model} model, B = {args.prompts * args.group} rows ({args.prompts} prompts x G = "
        f"{args.group}), S = {args.slots} lanes, turns <= {args.turns} of <= {args.turn_tokens} "
        f"tokens, max_tokens {args.max_tokens}, tools 0-{args.latency_ms:g} ms, "
        f"{args.workers} workers, backend {jax.default_backend()}, load {os.getloadavg()[0]:.1f}")
  for run in range(args.warmups + args.runs):
    for name, side in sides.items():
      t0 = time.perf_counter()
      # The same key every run: the same episodes, so the warm-up compiled every shape.
      result, computed = side(jax.random.PRNGKey(args.seed))
      wall = time.perf_counter() - t0
      useful = int(result.counts["env/policy_tokens"])
      warm = run < args.warmups
      if not warm:
        rows[name].append((useful / wall, useful / max(computed, 1), wall, useful,
                           result.counts["env/turns"] / result.counts["env/episodes"]))
      print(f"  run {run}{' (warm-up)' if warm else ''} {name:10s}: {wall:6.2f} s, "
            f"{useful} policy tokens, {useful / wall:7.1f} tok/s, utilisation "
            f"{useful / max(computed, 1):.1%}, {result.counts['env/turns']:.0f} turns",
            flush=True)
  print("\nside        useful tok/s (median [min-max])   slot utilisation   turns/episode")
  med = {}
  for name, got in rows.items():
    tps = [g[0] for g in got]
    med[name] = statistics.median(tps)
    print(f"{name:10s}  {med[name]:8.1f} [{min(tps):.1f}-{max(tps):.1f}]"
          f"{statistics.median(g[1] for g in got):18.1%}"
          f"{statistics.median(g[4] for g in got):16.2f}")
  print(f"continuous / turn_sync useful tokens/s: {med['continuous'] / med['turn_sync']:.2f}x "
        f"(load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
  main()

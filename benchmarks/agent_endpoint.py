"""The agent endpoint's overhead: the same episodes played by an OpenAI-client harness through the
endpoint (``env.engine='endpoint'``, ``calc_agent``) and by the in-process environment
(``env.engine='async_turns'``, ``tool_calc``), at the same batch and lanes (docs/agents.md).

Both sides decode with the same compiled lanes (``rljax.rollout.turns.run_lanes``) and keep each
episode's cache between its turns; the endpoint adds what an external harness costs: an HTTP
request and answer per call, the harness's own Python in a worker process, tokenising its text
prompt, and the host's scheduling of calls that arrive whenever their harnesses send them.
Workload: ``B`` episodes (``B / G`` ``tool_calc`` problems, ``G`` each) of a random-init Llama on
the char tokenizer, greedy (so both sides draw the same first turns), each turn at most
``--turn-tokens``. Reported per side: wall time of the whole batch and useful tokens/s (policy
tokens recorded / wall), median and range of ``--runs`` runs after ``--warmups`` that compiled
the shapes, sides alternated; and their ratio. Usage::

  python benchmarks/agent_endpoint.py                 # 1M model, B=64, 16 lanes
  python benchmarks/agent_endpoint.py --prompts 32    # B=256
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

import rljax.agents  # noqa: E402,F401  (registers calc_agent)
from bench_common import model_config  # noqa: E402
from rljax.agents import driver as driver_lib  # noqa: E402
from rljax.agents import harness as harness_lib  # noqa: E402
from rljax.data.tasks import make_task  # noqa: E402
from rljax.data.tokenizer import CharTokenizer  # noqa: E402
from rljax.envs import async_turns  # noqa: E402
from rljax.envs.episodes import EnvSettings  # noqa: E402
from rljax.models import transformer  # noqa: E402
from rljax.rollout.engines import JaxEngine  # noqa: E402
from rljax.rollout.sampling import SamplingParams  # noqa: E402


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--model", default="1M")
  p.add_argument("--prompts", type=int, default=8)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--slots", type=int, default=16)
  p.add_argument("--workers", type=int, default=16)
  p.add_argument("--turn-tokens", type=int, default=32)
  p.add_argument("--max-tokens", type=int, default=96)
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--warmups", type=int, default=2)
  a = p.parse_args()
  tok = CharTokenizer()
  cfg = model_config(a.model, tok.vocab_size)
  cfg = dataclasses.replace(cfg, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
  params = jax.tree.map(lambda x: 4.0 * x, transformer.init_params(cfg, seed=0))
  problems = [make_task("tool_calc", 0).problem_at(0, i) for i in range(a.prompts)]
  sp = SamplingParams(greedy=True, max_new_tokens=a.turn_tokens, stop_ids=(tok.eos_id,),
                      pad_id=tok.pad_id)
  common = dict(max_turns=3, max_tokens=a.max_tokens, timeout_s=600.0, slots=a.slots,
                max_prompt_tokens=16, workers=a.workers, harness_workers=a.workers)
  inproc = EnvSettings(name="tool_calc", engine="async_turns", **common)
  base = JaxEngine(cfg)
  base.load_weights(params, 0)
  endpoint = driver_lib.EndpointEngine(
      base, EnvSettings(name="calc_agent", engine="endpoint", **common), tok, prompt_bucket=8)
  key = jax.random.PRNGKey(0)

  def run_inproc():
    return async_turns.run_async_episodes(problems, key, cfg=cfg, params=params, tokenizer=tok,
                                          settings=inproc, sampling=sp, group_size=a.group,
                                          prompt_bucket=8, slots=a.slots)

  def run_endpoint():
    return endpoint.episodes(problems, key, sp, a.group)

  times = {"in-process": [], "endpoint": []}
  tokens = {}
  for i in range(a.warmups + a.runs):
    for name, run in (("in-process", run_inproc), ("endpoint", run_endpoint)):
      t0 = time.perf_counter()
      result = run()
      wall = time.perf_counter() - t0
      tokens[name] = float(result.rollout.mask.sum())
      calls = result.counts["env/turns"] / result.counts["env/episodes"]
      if i >= a.warmups:
        times[name].append(wall)
      print(f"{'warmup' if i < a.warmups else 'run'} {name}: {wall:.2f} s, "
            f"{tokens[name]:.0f} policy tokens, {calls:.2f} turns/episode, "
            f"errors {result.counts['env/errors']:.0f}", flush=True)
  endpoint.close()
  harness_lib.close_harness_pool()
  med = {k: statistics.median(v) for k, v in times.items()}
  for name, walls in times.items():
    print(f"{name}: {med[name]:.2f} s [{min(walls):.2f}, {max(walls):.2f}], "
          f"{tokens[name] / med[name]:.0f} useful tokens/s")
  print(f"endpoint / in-process wall: {med['endpoint'] / med['in-process']:.2f}x "
        f"(B = {a.prompts * a.group}, {a.slots} lanes, {a.model})")


if __name__ == "__main__":
  main()

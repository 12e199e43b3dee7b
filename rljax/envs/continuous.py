"""Continuous batching across turns (``env.engine='continuous'``), the host half.

The turn-synchronous driver (``rljax.envs.rollout.run_episodes``) runs a turn of every live row
in one sampler call, then every row's environment step, so each turn waits for its longest row
and its slowest tool, and re-prefills every trajectory from its first token. Here a row leaves
the decode loop as soon as its turn ends, its environment steps in a worker process
(asynchronously: ``EnvRunner.submit_step`` / ``poll``) while the other rows keep decoding, and it
re-enters with its KV cache kept: only the new ids (its last sampled token and the observation)
are prefilled, into its row of the cache store (``rljax.rollout.turns``). A slow tool costs its
own row's time, not the batch's.

The loop, on the host:

1. *Admit*: rows ready to (re)enter (all rows at first; later those whose observation came back,
   or whose turn goes on after a stop id that closed no marker) take the free lanes, at most
   ``slots``.
2. *Run*: one ``run_lanes`` call feeds the entering rows' new ids (and the decoding lanes' last
   tokens) in its first step, drawing one token per lane, then decodes, up to ``DECODE_STEPS``
   tokens per lane; it returns early once as many lanes ended their segment as there are rows
   waiting to enter (at most ``refill_rows``). Admission costs no call of its own: a separate
   prefill call per admission was a third of the wall time on CPU (docs/results/
   benchmarks_multiturn.md). The lanes narrow to ``S/4`` when few rows are left to decode, and a
   call reads the rows' caches only up to the deepest index it can reach (``span``).
3. *Step*: a row whose segment ended goes through the same bookkeeping as in the
   turn-synchronous driver (``end_segment``, ``apply_step``): its environment steps, or its turn
   continues, or its episode ends. Finished steps are collected without waiting while anything
   decodes, and waited for when nothing does.

A *segment* is what one sampler call of the turn-synchronous driver draws for a row: at most
``rollout.max_new_tokens`` tokens, up to a stop id. The two engines apply identical rules to it,
so they write the same record (``rljax.envs.rollout``'s layout: tokens after the prompt, the
mask on policy tokens, ``extras['source']``, ``sampler_logp`` on policy tokens), greedy
trajectories are the same, and the trainer cannot tell them apart. Token ``t`` of a row's segment
``s`` is drawn with ``fold_in(fold_in(key, s), t)`` at the row's own noise counters, so a
sampled rollout does not depend on tool latencies, lane counts or arrival order (the
turn-synchronous driver's noise depends on which rows share a call, so the two engines' sampled
trajectories differ).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, List, Optional, Sequence

import numpy as np

from rljax.envs import tools as tools_lib
from rljax.envs.rollout import (EnvSettings, MultiTurnResult, apply_step, end_segment,
                                finish_episodes, new_counts, start_episodes, turn_action,
                                turn_sampling)
from rljax.envs.runner import EnvRunner
from rljax.models.config import ModelConfig
from rljax.rollout import continuous as continuous_lib
from rljax.rollout import decode, sampler, turns

# Decode steps per host round trip at most: more amortise the call (a few ms on CPU) over more
# tokens; fewer let ended rows hand their lanes over sooner when no row is waiting to enter.
DECODE_STEPS = 16
# Entering rows' chunks are left-padded to a multiple of this (few compilations); a call that
# admits no row feeds chunks of 1 (the decoding lanes' last tokens).
CHUNK_BUCKET = 16
# A call reads its rows' cache up to the deepest index its tokens reach, rounded up to a multiple
# of this (a compilation per multiple; ``rljax.rollout.turns._gather``).
SPAN_BUCKET = 64
POLL_S = 0.05  # longest wait for a step's answer while nothing decodes (then look again)


@dataclasses.dataclass
class EngineStats:
  """What the engine computed, for benchmarks and metrics: ``computed`` token slots (every lane
  of every step, an entering row's first draw included), ``drawn`` tokens actually sampled,
  ``prefilled_tokens`` the entering rows' new ids, and how the host spent its wall time."""
  calls: int = 0
  steps: int = 0
  computed: int = 0
  drawn: int = 0
  prefilled_tokens: int = 0
  env_wait_s: float = 0.0  # blocked on environments with no lane decoding
  device_s: float = 0.0  # in ``run_lanes`` calls, results copied back
  # The most time one row spent with its steps in flight (submitted to collected): a floor of the
  # wall time that no batching of the decode can lower.
  tool_path_s: float = 0.0
  wall_s: float = 0.0

  @property
  def utilisation(self) -> float:
    return self.drawn / max(self.computed, 1)


@dataclasses.dataclass
class _Lane:
  """A row's segment in progress: the ids drawn so far (not in its trajectory yet) and those
  the next call feeds (the row's new ids when it enters, then the last drawn one)."""
  row: int
  cap: int  # most ids this segment may draw
  feed: List[int]
  ids: List[int] = dataclasses.field(default_factory=list)
  slp: List[float] = dataclasses.field(default_factory=list)
  dlp: List[float] = dataclasses.field(default_factory=list)


def lane_width(active: int, slots: int) -> int:
  """Rows of a call: ``S / 4`` when that holds ``active``, else ``S``. Two widths only: each is
  compiled for every span (``SPAN_BUCKET``), and the finer ``S/2, S/8`` steps bought less
  utilisation than their compilations cost in a short run (benchmarks/multiturn.py)."""
  narrow = max(1, slots // 4)
  return narrow if active <= narrow else slots


def span(deepest: int, length: int) -> int:
  """Cache indices a call reads: ``deepest`` (exclusive) rounded up to ``SPAN_BUCKET``, at most
  the store's ``length``."""
  return min(length, -(-deepest // SPAN_BUCKET) * SPAN_BUCKET)


def run_episodes_continuous(problems: Sequence, key, *, cfg: ModelConfig, params: Any,
                            tokenizer, settings: EnvSettings, sampling, group_size: int,
                            prompt_bucket: int, slots: int = 0, dtype: Optional[str] = None,
                            refill_rows: int = 0, runner: Optional[EnvRunner] = None,
                            stats: Optional[EngineStats] = None) -> MultiTurnResult:
  """Multi-turn rollouts of ``group_size`` trajectories per problem, continuously batched across
  turns (module docstring); same arguments and result as ``run_episodes``, with the policy given
  as ``cfg`` / ``params`` instead of a ``generate`` function.

  slots: ``S``, lanes decoding at once (``env.slots``); 0: every row of the batch.
  dtype: the sampler's compute dtype (``rollout.dtype``); None: the model's.
  refill_rows: a decode call returns once this many lanes ended while rows wait to enter;
    0: ``S // 8`` (at least 1).
  stats: filled with what the engine computed (``EngineStats``).
  """
  t_start = time.monotonic()
  runner = runner or settings.runner
  stats = stats if stats is not None else EngineStats()
  g = int(group_size)
  b, budget = len(problems) * g, int(settings.max_tokens)
  s_max = min(int(slots) or b, b)
  refill = int(refill_rows) or continuous_lib.default_refill_rows(s_max)
  sp = turn_sampling(sampling, tokenizer, settings)
  stops = set(sp.stop_ids)
  close = tools_lib.close_marker(settings.tool_format)
  counts = new_counts()
  prompts, episodes = start_episodes(problems, g, tokenizer=tokenizer, settings=settings,
                                     runner=runner)

  # The store: a row per episode, long enough for the widest prompt bucket and the budget.
  width = -(-max(len(p) for p in prompts) // prompt_bucket) * prompt_bucket
  cfg = sampler.sampler_config(cfg, dtype)
  # One index to spare: a decode lane with nothing to write writes at its span's last index,
  # which must lie past every index the lane holds (``lanes_call``).
  length = width + budget + 1
  cfg, weights = decode.inference_weights(cfg, params, length)
  store = turns.init_store(cfg, b, length)

  seq = lambda r: prompts[episodes[r].problem] + episodes[r].ids
  cached = [0] * b  # ids of each row's trajectory whose keys/values the store holds
  segment = [0] * b  # segments each row started (their keys)
  in_tool = [0.0] * b  # each row's time with a step in flight so far
  ready = collections.deque(r for r, ep in enumerate(episodes) if ep.running)
  lanes: List[_Lane] = []

  def close_segment(lane: _Lane) -> None:
    r, ep = lane.row, episodes[lane.row]
    segment[r] += 1
    stopped = bool(lane.ids) and lane.ids[-1] in stops
    what = end_segment(ep, lane.ids, lane.slp, lane.dlp, stopped, tokenizer=tokenizer,
                       budget=budget, close=close, counts=counts)
    if what == "continue":
      ready.append(r)
    elif what == "step":
      runner.submit_step(r, ep.env, turn_action(ep, tokenizer))
      in_tool[r] -= time.monotonic()

  def admit() -> None:
    """Ready rows take free lanes, a power of two of them (few compiled shapes); their new ids
    are fed by the next call."""
    free = min(s_max - len(lanes), len(ready))
    for _ in range(1 << free.bit_length() - 1 if free else 0):
      r = ready.popleft()
      cap = max(1, min(sp.max_new_tokens, budget - len(episodes[r].ids) + 1))
      lanes.insert(0, _Lane(r, cap, feed=seq(r)[cached[r]:]))

  def lanes_call() -> None:
    nonlocal store, lanes
    e = sum(not l.ids for l in lanes)  # the entering lanes, first
    w = lane_width(len(lanes), s_max)
    c = -(-max([len(l.feed) for l in lanes[:e]] or [1]) // CHUNK_BUCKET) * CHUNK_BUCKET
    chunk = np.full((e, c), tokenizer.pad_id, np.int32)
    chunk_mask = np.zeros((e, c), np.int32)
    for i, lane in enumerate(lanes[:e]):
      chunk[i, c - len(lane.feed):], chunk_mask[i, c - len(lane.feed):] = lane.feed, 1
    fill = lambda f, pad: np.asarray([f(lane) for lane in lanes] + [pad] * (w - len(lanes)),
                                     np.int32)
    want = min(len(ready), refill) if ready else w + 1
    deepest = max(cached[l.row] + len(l.feed) - 1 + min(DECODE_STEPS, l.cap - len(l.ids))
                  for l in lanes)
    t0 = time.monotonic()
    store, out_tok, out_lp, out_dlp, count, running, steps = turns.run_lanes(
        weights, store, fill(lambda l: l.row, b), fill(lambda l: l.feed[-1], 0), chunk,
        chunk_mask, fill(lambda l: cached[l.row], 0), fill(lambda l: l.cap - len(l.ids), 0),
        fill(lambda l: len(l.ids), 0), key, fill(lambda l: segment[l.row], 0),
        fill(lambda l: l.row, 0), np.int32(want), cfg=cfg, sp=sp, steps=DECODE_STEPS,
        span=span(1 + deepest, length))
    out_tok, out_lp, out_dlp, count, running = (
        np.asarray(x) for x in (out_tok, out_lp, out_dlp, count, running))
    steps = int(steps)
    stats.device_s += time.monotonic() - t0
    stats.calls += 1
    stats.steps += steps
    stats.computed += w * steps
    stats.drawn += int(count.sum())
    stats.prefilled_tokens += sum(len(l.feed) for l in lanes if not l.ids)
    still = []
    for i, lane in enumerate(lanes):
      n = int(count[i])  # >= 1: every lane draws at the first step
      cached[lane.row] += len(lane.feed) + n - 1  # the chunk and every drawn token but the last
      lane.ids += out_tok[i, :n].tolist()
      lane.slp += out_lp[i, :n].tolist()
      lane.dlp += out_dlp[i, :n].tolist()
      lane.feed = lane.ids[-1:]
      if running[i]:
        still.append(lane)
      else:
        close_segment(lane)
    lanes = still

  def collect(wait_s: float) -> None:
    t0 = time.monotonic()
    for r, outcome in runner.poll(wait_s):
      in_tool[r] += time.monotonic()
      ep = episodes[r]
      apply_step(ep, outcome, tokenizer, settings, budget, counts)
      if ep.running:
        ready.append(r)
    if wait_s:
      stats.env_wait_s += time.monotonic() - t0

  while True:
    admit()
    if lanes:
      lanes_call()
    if runner.in_flight:
      collect(0.0 if (lanes or ready) else POLL_S)
    if not (lanes or ready or runner.in_flight):
      break

  stats.wall_s += time.monotonic() - t_start
  stats.tool_path_s = max(stats.tool_path_s, max(in_tool))
  return finish_episodes(episodes, prompts, tokenizer=tokenizer, group_size=g,
                         prompt_bucket=prompt_bucket, budget=budget, counts=counts,
                         turn_discount=settings.turn_discount)

"""Continuous batching across turns (``env.engine='async_turns'``), the host half.

The turn-synchronous driver (``rljax.envs.episodes.run_episodes``) runs a turn of every live row
in one sampler call, then every row's environment step, so each turn waits for its longest row
and its slowest tool, and re-prefills every trajectory from its first token. Here a row leaves
the decode loop as soon as its turn ends, its environment steps in a worker process
(asynchronously: ``EnvRunner.submit_step`` / ``poll``) while the other rows keep decoding, and it
re-enters with its KV cache kept: only the new ids (its last sampled token and the observation)
are prefilled, into its row of the cache store (``rljax.rollout.turns``). A slow tool costs its
own row's time, not the batch's.

The loop, on the host:

1. *Queue*: rows ready to (re)enter (all rows at first; later those whose observation came back,
   or whose turn goes on after a stop id that closed no marker) queue for lanes, at most ``W``
   per call (the call's lanes).
2. *Run*: one ``run_lanes`` call decodes the lanes, up to ``DECODE_STEPS`` tokens each, and
   whenever ``refill_rows`` lanes are free the next queued rows take them inside the call (their
   new ids fed in one chunk forward, their first tokens drawn), so a call returns for the host's
   bookkeeping, not to refill lanes: while the host refilled them, calls returned every ~4
   steps and their fixed cost (~5 ms on CPU, against ~0.8 ms per step) was most of the engine's
   time (docs/results/benchmarks/multiturn.md). Once its queue is empty a call returns when
   ``refill_rows`` lanes idle. The lanes narrow to ``S/8``, ``S/4`` or ``S/2`` when few rows are
   left to decode, and a full-width call reads the rows' caches only up to the deepest index it
   can reach (``span``).
3. *Step*: a row whose segment ended goes through the same bookkeeping as in the
   turn-synchronous driver (``end_segment``, ``apply_step``): its environment steps, or its turn
   continues, or its episode ends. Finished steps are collected without waiting while anything
   decodes, and waited for when nothing does.

A *segment* is what one sampler call of the turn-synchronous driver draws for a row: at most
``rollout.max_new_tokens`` tokens, up to a stop id. The two engines apply identical rules to it,
so they write the same record (``rljax.envs.episodes``'s layout: tokens after the prompt, the
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

import jax
import numpy as np

from rljax.envs.episodes import (EnvSettings, MultiTurnResult, apply_step, end_segment,
                                finish_episodes, new_counts, start_episodes, turn_action,
                                turn_close, turn_sampling)
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
  of every decode step, and ``refill_rows`` first draws per admission, however many rows it
  took), ``drawn`` tokens actually sampled,
  ``prefilled_tokens`` the entering rows' new ids, and how the host spent its wall time."""
  calls: int = 0
  steps: int = 0  # decode steps of all lanes
  admissions: int = 0  # chunk forwards of queued rows entering lanes inside a call
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
  """Rows of a call: the narrowest of ``S / 8``, ``S / 4``, ``S / 2``, ``S`` that holds
  ``active``. A narrow call reads whole store rows (``span``), so each narrow width is one
  compiled shape. While rows wait for their tools few lanes decode, and with two widths only
  (``S / 4``, ``S``) a quarter of the computed lane-steps were idle
  (docs/results/benchmarks/multiturn.md)."""
  for width in sorted({max(1, slots // 8), max(1, slots // 4), max(1, slots // 2)}):
    if active <= width:
      return width
  return slots


def span(deepest: int, length: int, narrow: bool = False) -> int:
  """Cache indices a call reads: ``deepest`` (exclusive) rounded up to ``SPAN_BUCKET``, at most
  the store's ``length``; all ``length`` for a narrow call. Each span is a compiled shape: a
  narrow call (at most ``S / 2`` lanes) reads at most half the bytes per step anyway, and the
  engine runs narrow often, at spans a short run would otherwise still be compiling."""
  return length if narrow else min(length, -(-deepest // SPAN_BUCKET) * SPAN_BUCKET)


def run_async_episodes(problems: Sequence, key, *, cfg: ModelConfig, params: Any,
                            tokenizer, settings: EnvSettings, sampling, group_size: int,
                            prompt_bucket: int, slots: int = 0, dtype: Optional[str] = None,
                            refill_rows: int = 0, runner: Optional[EnvRunner] = None,
                            stats: Optional[EngineStats] = None) -> MultiTurnResult:
  """Multi-turn rollouts of ``group_size`` trajectories per problem, continuously batched across
  turns (module docstring); same arguments and result as ``run_episodes``, with the policy given
  as ``cfg`` / ``params`` instead of a ``generate`` function.

  slots: ``S``, lanes decoding at once (``env.slots``); 0: every row of the batch.
  dtype: the sampler's compute dtype (``rollout.dtype``); None: the model's.
  refill_rows: queued rows enter a call's free lanes this many at a time (one chunk forward), and
    a call whose queue ran out returns once this many lanes idle; 0: ``S // 8`` (at least 1).
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
  close = turn_close(tokenizer, settings.tool_format)
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

  def new_lane(r: int) -> _Lane:
    cap = max(1, min(sp.max_new_tokens, budget - len(episodes[r].ids) + 1))
    return _Lane(r, cap, feed=seq(r)[cached[r]:])

  def lanes_call() -> None:
    """One ``run_lanes`` call: the lanes decode, and up to ``W`` ready rows queue to take
    lanes that free up inside the call."""
    nonlocal store, lanes
    w = lane_width(len(lanes) + len(ready), s_max)
    queue = [new_lane(ready.popleft()) for _ in range(min(w, len(ready)))]
    c = -(-max([len(l.feed) for l in queue] or [1]) // CHUNK_BUCKET) * CHUNK_BUCKET
    chunk = np.full((w, c), tokenizer.pad_id, np.int32)
    chunk_mask = np.zeros((w, c), np.int32)
    for i, lane in enumerate(queue):
      chunk[i, c - len(lane.feed):], chunk_mask[i, c - len(lane.feed):] = lane.feed, 1

    def fill(group, f, pad):
      return np.asarray([f(l) for l in group] + [pad] * (w - len(group)), np.int32)
    lane_args = dict(idx=fill(lanes, lambda l: l.row, b), tok=fill(lanes, lambda l: l.feed[-1], 0),
                     start=fill(lanes, lambda l: cached[l.row], 0),
                     budget=fill(lanes, lambda l: l.cap - len(l.ids), 0),
                     drawn=fill(lanes, lambda l: len(l.ids), 0),
                     segment=fill(lanes, lambda l: segment[l.row], 0))
    queue_args = dict(idx=fill(queue, lambda l: l.row, b), chunk=chunk, mask=chunk_mask,
                      start=fill(queue, lambda l: cached[l.row], 0),
                      budget=fill(queue, lambda l: l.cap, 0),
                      segment=fill(queue, lambda l: segment[l.row], 0))
    # A row that enters before the first step draws DECODE_STEPS + 1 tokens at most.
    deepest = max(cached[l.row] + len(l.feed) - 1 + min(DECODE_STEPS + 1, l.cap - len(l.ids))
                  for l in lanes + queue)
    k = min(refill, w)
    t0 = time.monotonic()
    # Once its queue is empty the call returns when ``refill`` more lanes idle than it could fill
    # (rows that ended meanwhile then submit their steps): running the full DECODE_STEPS with
    # idle lanes instead made the tool-bound 64-episode benchmark slower (1.45x against 1.54x).
    store, out = turns.run_lanes(weights, store, lane_args, queue_args, key, np.int32(refill),
                                 cfg=cfg, sp=sp, steps=DECODE_STEPS,
                                 span=span(1 + deepest, length, w < s_max), admit_rows=k)
    out = jax.device_get(out)
    stats.device_s += time.monotonic() - t0
    steps, admissions = int(out["steps"]), int(out["admissions"])
    stats.calls += 1
    stats.steps += steps
    stats.admissions += admissions
    stats.computed += w * steps + k * admissions
    stats.drawn += int(out["count"].sum())
    still = []
    for i, lane in list(enumerate(lanes)) + [(w + j, l) for j, l in enumerate(queue)]:
      n = int(out["count"][i])
      if not n:  # a queued row that found no free lane: first in line for the next call
        continue
      if i >= w:
        stats.prefilled_tokens += len(lane.feed)
      cached[lane.row] += len(lane.feed) + n - 1  # the fed ids and every drawn one but the last
      lane.ids += out["tokens"][i, :n].tolist()
      lane.slp += out["sampler_logp"][i, :n].tolist()
      lane.dlp += out["draw_logp"][i, :n].tolist()
      lane.feed = lane.ids[-1:]
      if out["running"][i]:
        still.append(lane)
      else:
        close_segment(lane)
    ready.extendleft(reversed([l.row for j, l in enumerate(queue) if not out["count"][w + j]]))
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
    if lanes or ready:
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

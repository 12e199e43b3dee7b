"""The endpoint's engine half: every call of every episode in flight served by continuous
batching across calls, with the exact ids and log-probs of what was drawn recorded.

Every episode of a batch owns one row of a device-resident KV-cache store (``rljax.rollout.
turns``, as the ``async_turns`` engine's episodes do). A call (``protocol.Call``: its prompt ids)
queues for a *lane*; rows decode in up to ``env.slots`` lanes at once, one ``run_lanes`` call at a
time, and a queued call takes a lane as soon as one frees up inside the call (its new ids fed in
one chunk forward), so calls of different episodes, arriving whenever their harnesses send them,
share every decode step. A call's prompt reuses its row's cache up to the longest prefix it
shares with the ids the row held (the previous call's prompt and answer): a harness that extends
its conversation is prefilled only its new tokens; one that re-renders its history is prefilled
from where the texts differ. Token ``t`` of an episode's call ``k`` is drawn with
``fold_in(fold_in(key, k), t)`` at the row's own noise counters, so what an episode draws does
not depend on which other calls share its steps.

A call ends at EOS, at its cap (``max_tokens``, ``rollout.max_new_tokens``, the episode's room),
or at the first token that completes one of its ``stop`` strings (checked by the host after
every ``run_lanes`` call: the lane is ended there, at most ``DECODE_STEPS`` tokens later, and the
tokens after the stop are dropped, never recorded or returned). Its ``CallRecord`` holds the
prompt ids, the answer's ids, ``sampler_logp`` and ``draw_logp`` exactly as the sampler returned
them, and the version of the weights that drew them (``engine.version``).
"""
from __future__ import annotations

import collections
import dataclasses
import queue
import threading
from typing import Callable, List, Optional

import jax
import numpy as np

from rljax.agents import protocol
from rljax.envs.async_turns import CHUNK_BUCKET, DECODE_STEPS, lane_width, span
from rljax.envs.episodes import turn_text
from rljax.rollout import continuous as continuous_lib
from rljax.rollout import decode, sampler, turns

POLL_S = 0.01  # longest wait for a request or a harness while nothing decodes


@dataclasses.dataclass
class CallRecord:
  """One served call, as the sampler drew it."""
  prompt_ids: List[int]
  completion_ids: List[int]
  sampler_logp: List[float]
  draw_logp: List[float]
  version: int
  finish: str  # 'stop' or 'length'
  reused: int  # prompt ids whose keys/values the row already held
  tool_calls: int = 0
  tool_errors: int = 0


@dataclasses.dataclass
class Pending:
  """A request waiting for its answer: ``reply`` is set to ``(body, record)`` or to a
  ``protocol.RequestError``, then ``done`` fires."""
  row: int
  call: protocol.Call
  done: threading.Event = dataclasses.field(default_factory=threading.Event)
  reply: object = None

  def finish(self, reply) -> None:
    self.reply = reply
    self.done.set()


@dataclasses.dataclass
class RowState:
  """An episode's row: its calls, what its cache holds, its queue of requests."""
  calls: List[CallRecord] = dataclasses.field(default_factory=list)
  held: List[int] = dataclasses.field(default_factory=list)  # ids of the last call's sequence
  cached: int = 0  # leading ids of ``held`` whose keys/values the store row holds
  waiting: collections.deque = dataclasses.field(default_factory=collections.deque)
  active: Optional[Pending] = None
  closed: bool = False
  refused: List[str] = dataclasses.field(default_factory=list)  # why calls were refused
  # The codes of calls refused by the record's rule: 'context_length_exceeded' (a prompt over
  # the model's context), 'episode_budget_exceeded' (env.max_tokens), 'max_turns'.
  codes: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Lane:
  row: int
  pending: Pending
  cap: int
  start: int  # the cache index of the first fed id
  feed: List[int]
  cached: int  # leading prompt + answer ids in the cache so far
  ids: List[int] = dataclasses.field(default_factory=list)
  slp: List[float] = dataclasses.field(default_factory=list)
  dlp: List[float] = dataclasses.field(default_factory=list)
  entered: bool = False


def common_prefix(a, b) -> int:
  n = min(len(a), len(b))
  diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
  return int(diff[0]) if diff.size else n


class Batch:
  """The calls of one batch of episodes (``rows`` of them), served until ``finished()`` says
  every episode is over. ``room(row, prompt_ids) -> (cap, why)`` is the record's rule (how many
  tokens a call may draw, or why it cannot be served: ``rljax.agents.trajectory``)."""

  def __init__(self, *, cfg, params, tokenizer, sampling, rows: int, length: int, slots: int,
               dtype, key, version: int, room: Callable, tool_format: str):
    self.tokenizer, self.key, self.version = tokenizer, key, version
    self.rows, self.length, self.room, self.tool_format = rows, length, room, tool_format
    self.sp = dataclasses.replace(sampling, pad_id=tokenizer.pad_id, stop_ids=(tokenizer.eos_id,))
    self.slots = min(int(slots) or rows, rows)
    self.refill = continuous_lib.default_refill_rows(self.slots)
    cfg = sampler.sampler_config(cfg, dtype)
    self.cfg, self.weights = decode.inference_weights(cfg, params, length)
    self.store = turns.init_store(self.cfg, rows, length)
    self.state = [RowState() for _ in range(rows)]
    self.inbox: "queue.Queue[Pending]" = queue.Queue()
    self.ready: collections.deque = collections.deque()
    self.lanes: List[_Lane] = []
    self.counts = collections.Counter()
    self._lock = threading.Lock()

  # --- requests (any thread) ----------------------------------------------------------------------

  def refuse(self, row: int, why: str) -> None:
    """A request of ``row`` refused before it was a call (malformed, unsupported): counted."""
    with self._lock:
      self.state[row].refused.append(why)
      self.counts["refused"] += 1

  def submit(self, row: int, call: protocol.Call) -> Pending:
    pending = Pending(row, call)
    self.inbox.put(pending)
    return pending

  # --- the loop (the caller's thread) ---------------------------------------------------------------

  def close_row(self, row: int) -> None:
    """The episode is over: its queued requests are refused, its answer in flight dropped."""
    state = self.state[row]
    state.closed = True
    for pending in list(state.waiting) + ([state.active] if state.active else []):
      pending.finish(protocol.RequestError("the episode is over", 404, "episode_over"))
    state.waiting.clear()
    state.active = None

  def step(self) -> None:
    """Take the new requests, then one ``run_lanes`` call if anything decodes (else wait a
    little for a request)."""
    block = not (self.lanes or self.ready)
    try:
      while True:
        self._take(self.inbox.get(timeout=POLL_S) if block else self.inbox.get_nowait())
        block = False
    except queue.Empty:
      pass
    if self.lanes or self.ready:
      self._lanes_call()

  def _take(self, pending: Pending) -> None:
    state = self.state[pending.row]
    if state.closed:
      pending.finish(protocol.RequestError("the episode is over", 404, "episode_over"))
    elif state.active is not None:
      state.waiting.append(pending)
    else:
      self._start(pending)

  def _start(self, pending: Pending) -> None:
    row, state = pending.row, self.state[pending.row]
    prompt = list(pending.call.prompt_ids)
    cap, why, code = self.room(row, prompt)
    if pending.call.max_tokens is not None:
      cap = min(cap, pending.call.max_tokens)
    cap = min(cap, self.sp.max_new_tokens, self.length - 1 - len(prompt))
    if cap < 1:
      why = why or (f"a prompt of {len(prompt)} tokens leaves no room to answer in the "
                    f"model's context of {self.length - 1}")
      code = code or "context_length_exceeded"
      self.refuse(row, why)
      state.codes.add(code)
      pending.finish(protocol.RequestError(why, 400, code))
      self._next(row)
      return
    reuse = min(common_prefix(state.held[:state.cached], prompt), len(prompt) - 1)
    self.counts["reused_tokens"] += reuse
    self.counts["prefilled_tokens"] += len(prompt) - reuse
    state.active = pending
    self.ready.append(_Lane(row, pending, cap, reuse, prompt[reuse:], reuse))

  def _next(self, row: int) -> None:
    state = self.state[row]
    state.active = None
    if state.waiting and not state.closed:
      self._start(state.waiting.popleft())

  def _lanes_call(self) -> None:
    # An ended episode's answer in flight is dropped (``close_row``), its lane freed.
    self.lanes = [l for l in self.lanes if self.state[l.row].active is l.pending]
    self.ready = collections.deque(l for l in self.ready if self.state[l.row].active is l.pending)
    if not (self.lanes or self.ready):
      return
    w = lane_width(len(self.lanes) + len(self.ready), self.slots)
    queue_ = [self.ready.popleft() for _ in range(min(w, len(self.ready)))]
    c = -(-max([len(l.feed) for l in queue_] or [1]) // CHUNK_BUCKET) * CHUNK_BUCKET
    chunk = np.full((w, c), self.tokenizer.pad_id, np.int32)
    chunk_mask = np.zeros((w, c), np.int32)
    for i, lane in enumerate(queue_):
      chunk[i, c - len(lane.feed):], chunk_mask[i, c - len(lane.feed):] = lane.feed, 1
    segment = lambda l: len(self.state[l.row].calls)  # the call's index: its noise key

    def fill(group, f, pad):
      return np.asarray([f(l) for l in group] + [pad] * (w - len(group)), np.int32)
    lanes, b = self.lanes, self.rows
    lane_args = dict(idx=fill(lanes, lambda l: l.row, b), tok=fill(lanes, lambda l: l.feed[-1], 0),
                     start=fill(lanes, lambda l: l.cached, 0),
                     budget=fill(lanes, lambda l: l.cap - len(l.ids), 0),
                     drawn=fill(lanes, lambda l: len(l.ids), 0), segment=fill(lanes, segment, 0))
    queue_args = dict(idx=fill(queue_, lambda l: l.row, b), chunk=chunk, mask=chunk_mask,
                      start=fill(queue_, lambda l: l.start, 0),
                      budget=fill(queue_, lambda l: l.cap, 0), segment=fill(queue_, segment, 0))
    deepest = max(l.cached + len(l.feed) - 1 + min(DECODE_STEPS + 1, l.cap - len(l.ids))
                  for l in lanes + queue_)
    k = min(self.refill, w)
    self.store, out = turns.run_lanes(
        self.weights, self.store, lane_args, queue_args, self.key, np.int32(self.refill),
        cfg=self.cfg, sp=self.sp, steps=DECODE_STEPS,
        span=span(1 + deepest, self.length, w < self.slots), admit_rows=k)
    out = jax.device_get(out)
    self.counts["lane_calls"] += 1
    still = []
    for i, lane in list(enumerate(lanes)) + [(w + j, l) for j, l in enumerate(queue_)]:
      n = int(out["count"][i])
      if not n:  # a queued call that found no free lane: first in line for the next call
        continue
      lane.cached += len(lane.feed) + n - 1
      lane.ids += out["tokens"][i, :n].tolist()
      lane.slp += out["sampler_logp"][i, :n].tolist()
      lane.dlp += out["draw_logp"][i, :n].tolist()
      lane.feed = lane.ids[-1:]
      cut = protocol.cut_at_stop(self._shown, lane.ids, lane.pending.call.stop)
      if cut is not None:
        self._finish(lane, cut[0], "stop", cut[1])
      elif out["running"][i]:
        still.append(lane)
      else:
        self._finish(lane, len(lane.ids), "stop" if lane.ids[-1] == self.tokenizer.eos_id
                     else "length", None)
    self.ready.extendleft(reversed([l for j, l in enumerate(queue_) if not out["count"][w + j]]))
    self.lanes = still

  def _shown(self, ids) -> str:
    """The text a harness is answered: special tokens skipped (vLLM's default)."""
    return self.tokenizer.decode(ids, skip_special_tokens=True)

  def _finish(self, lane: _Lane, keep: int, finish: str, text: Optional[str]) -> None:
    """The call's answer: recorded, sent, and the row's next request started."""
    state = self.state[lane.row]
    if state.closed or state.active is not lane.pending:  # the episode ended meanwhile
      return
    prompt = list(lane.pending.call.prompt_ids)
    ids = lane.ids[:keep]
    record = CallRecord(prompt, ids, lane.slp[:keep], lane.dlp[:keep], self.version, finish,
                        lane.start)
    drawn = protocol.Answer(self._shown(ids) if text is None else text, finish, tuple(prompt),
                            tuple(ids), turn_text(self.tokenizer, ids))
    body, record.tool_calls, record.tool_errors = protocol.answer(lane.pending.call, drawn,
                                                                  self.tool_format)
    state.calls.append(record)
    state.held = prompt + ids
    state.cached = min(lane.cached, len(state.held))
    self.counts["calls"] += 1
    lane.pending.finish((body, record))
    self._next(lane.row)

  @property
  def busy(self) -> bool:
    return bool(self.lanes or self.ready)


def wait_reply(pending: Pending, timeout_s: float):
  """The reply of a request (``(body, record)``), or the ``RequestError`` it was refused
  with; a 503 when nothing answered in ``timeout_s``."""
  if not pending.done.wait(timeout_s):
    return protocol.RequestError(f"no answer in {timeout_s:.0f} s", 503, "unavailable")
  return pending.reply


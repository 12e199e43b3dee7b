"""``env.engine='endpoint'``: episodes played by agent harnesses against an OpenAI-compatible
endpoint served by the run's own engine (docs/agents.md).

For a batch of ``Pn`` problems and ``G`` episodes each, the engine:

1. starts (once) the HTTP server (``rljax.agents.server``) and gives each episode a base URL of
   its own;
2. runs each episode's harness (``env.name``, ``rljax.agents.harness``) in a worker process,
   ``env.harness_workers`` at once, each within ``env.timeout_s``;
3. serves their calls as they come, continuously batched across episodes
   (``rljax.agents.serving.Batch``: the current weights, the run's sampling, the exact ids and
   log-probs of every call recorded with the weights' version), until every harness has
   returned, failed or timed out;
4. writes each episode as one row of the record (``rljax.agents.trajectory``: calls stitched
   while they extend each other, separate samples sharing the reward when they do not), its
   reward the harness's result.

The record has the multi-turn layout (``rljax.envs.episodes``: ``tokens`` after the first
prompt, ``mask`` on the policy's tokens, ``extras['source']``), plus ``extras['segment']`` and
``extras['weight_version']``. An episode fails (reward 0, ``env/errors`` or ``env/timeouts``,
explained in ``env_failures.jsonl``) when its harness raises, hangs past ``env.timeout_s``, dies,
returns something that is not a result, never calls the endpoint, or sends a first prompt longer
than the model's context; a call refused for another reason (a malformed or unsupported request:
a 400 the harness sees) is counted (``agent/refused``) and named in the failure if the harness
then fails.
"""
from __future__ import annotations

import dataclasses
import secrets
from typing import List, Optional

import numpy as np

from rljax.agents import harness as harness_lib
from rljax.agents import protocol, trajectory
from rljax.agents.serving import Batch, CallRecord
from rljax.agents.server import EndpointServer
from rljax.envs.drivers import EpisodeEngineBase
from rljax.envs.episodes import EnvSettings, Episode, MultiTurnResult, new_counts, tally
from rljax.errors import StartupError
from rljax.rollout.engines import JaxEngine, RolloutEngine, register_episode_engine
from rljax.rollout.sampling import SamplingParams


@dataclasses.dataclass
class AgentResult(MultiTurnResult):
  """A batch's ``MultiTurnResult`` and every call of every episode as it was served."""
  calls: List[List[CallRecord]] = dataclasses.field(default_factory=list)


class EndpointEngine(EpisodeEngineBase):
  """The endpoint driver around a JAX engine (module docstring)."""

  steps = False  # it plays agent harnesses

  def __init__(self, base: RolloutEngine, settings: EnvSettings, tokenizer, prompt_bucket: int):
    if not isinstance(base, JaxEngine):
      raise StartupError(f"env.engine='{harness_lib.ENDPOINT_ENGINE}' decodes with a JAX "
                         f"engine's weights; the rollout engine is a {type(base).__name__}")
    super().__init__(base, settings, tokenizer, prompt_bucket)
    self.harness = harness_lib.harness_of(settings.name)
    # What the harness needs started before its workers fork (an environment server).
    getattr(self.harness, "prepare", lambda: None)()
    self.server: Optional[EndpointServer] = None

  def _server(self) -> EndpointServer:
    if self.server is None:
      # A request waits at most for its episode (whose harness is killed at env.timeout_s, which
      # answers what it still waits for): the margin covers a harness that outlives its row.
      self.server = EndpointServer(self.tokenizer,
                                   reply_timeout_s=2 * self.settings.timeout_s + 60)
    return self.server

  def episodes(self, problems, key, sampling: SamplingParams, group_size: int) -> AgentResult:
    s, base, g = self.settings, self.base, int(group_size)
    rows = len(problems) * g
    limit = s.max_prompt_tokens or base.model_cfg.max_position_embeddings - s.max_tokens
    batch = Batch(cfg=base.model_cfg, params=base.weights, tokenizer=self.tokenizer,
                  sampling=sampling, rows=rows, length=limit + s.max_tokens + 1, slots=s.slots,
                  dtype=base.dtype, key=key, version=base.version, tool_format=s.tool_format,
                  room=lambda row, prompt: trajectory.room(batch.state[row].calls, prompt,
                                                           s.max_tokens, limit, s.max_turns))
    server = self._server()
    tokens = {secrets.token_hex(12): r for r in range(rows)}
    server.attach(batch, tokens)
    pool = harness_lib.harness_pool(s.harness_workers, s.max_worker_memory_mb)
    for token, r in tokens.items():
      task = harness_lib.AgentTask(server.base_url(token), token, protocol.MODEL_NAME,
                                   problems[r // g])
      pool.submit(r, (s.name, task), timeout_s=s.timeout_s)
    ends = {}
    try:
      while len(ends) < rows:
        batch.step()
        for r, outcome in pool.poll(0.0):
          ends[r] = harness_lib.outcome_result(outcome)
          batch.close_row(r)
    except BaseException:
      harness_lib.close_harness_pool()  # its calls in flight would outlive the batch
      raise
    finally:
      for r in range(rows):
        batch.close_row(r)
      server.detach()
    return self._result(problems, g, batch, ends)

  def _result(self, problems, g: int, batch: Batch, ends: dict) -> AgentResult:
    s, tok = self.settings, self.tokenizer
    episodes, prompts, segments, versions = [], [], [], []
    counts = new_counts()
    for r, state in enumerate(batch.state):
      ep = Episode(problem=r // g)
      calls = state.calls
      prompts.append(calls[0].prompt_ids if calls else _prompt_ids(tok, problems[r // g]))
      segments.append(trajectory.stitch(ep, calls))
      versions.append(min([c.version for c in calls] or [batch.version]))
      ep.turns = len(calls)
      ep.tool_calls = sum(c.tool_calls for c in calls)
      ep.tool_errors = sum(c.tool_errors for c in calls)
      _end(ep, state, *ends[r], calls=calls, timeout_s=s.timeout_s)
      counts["env/policy_tokens"] += sum(len(c.completion_ids) for c in calls)
      episodes.append(ep)
    rollout = trajectory.record(episodes, prompts, segments, versions, budget=s.max_tokens,
                                prompt_bucket=self.prompt_bucket, pad_id=tok.pad_id)
    tally(episodes, counts)
    n_segments = [max(seg or [1]) for seg in segments]
    counts.update({"agent/calls": float(batch.counts["calls"]),
                   "agent/refused": float(batch.counts["refused"]),
                   "agent/samples": float(sum(n_segments)),
                   "agent/split_episodes": float(sum(n > 1 for n in n_segments)),
                   "agent/reused_tokens": float(batch.counts["reused_tokens"]),
                   "agent/prefilled_tokens": float(batch.counts["prefilled_tokens"])})
    return AgentResult(rollout, episodes, [tok.decode(ep.ids) for ep in episodes], counts,
                       [state.calls for state in batch.state])

  def close(self) -> None:
    getattr(self.harness, "close", lambda: None)()
    if self.server is not None:
      self.server.close()
      self.server = None
    super().close()


def _prompt_ids(tokenizer, problem) -> list:
  """The row's prompt of an episode that made no call: the problem's, as a prompt is encoded."""
  try:
    return tokenizer.encode_prompt(problem.prompt) or [tokenizer.eos_id]
  except Exception:  # a prompt this tokenizer cannot encode (the harness wrote its own)
    return [tokenizer.eos_id]


def _end(ep: Episode, state, result, end: str, why: str, *, calls, timeout_s: float) -> None:
  """How the episode ended (module docstring), its reward and verdict. A call refused for the
  episode's own limits (``env.max_tokens``, ``env.max_turns``) ends it truncated whatever the
  harness did next (an agent that raises on a context-length error is ordinary), with the
  harness's reward if it returned one, else 0."""
  refused = f"; the endpoint refused a call: {state.refused[0]}" if state.refused else ""
  limit = ("max_tokens" if "episode_budget_exceeded" in state.codes else
           "max_turns" if "max_turns" in state.codes else "")
  if limit and calls and "context_length_exceeded" not in state.codes:
    ep.end, ep.truncated = limit, limit == "max_tokens"
    ep.turn_rewards, ep.turn_ends = [result.reward if result else 0.0], [_last_policy(ep)]
    ep.correct = bool(result and result.correct)
    ep.infos = [result.info if result else {"harness": end, "why": why[:300]}]
  elif end == "timeout":
    ep.end, ep.error = "timeout", f"the harness ran over env.timeout_s={timeout_s} s{refused}"
  elif end == "error":
    ep.end, ep.error = "error", f"the harness failed: {why}{refused}"
  elif not calls and not state.refused:
    ep.end, ep.error = "error", "the harness made no call to the endpoint"
  elif "context_length_exceeded" in state.codes:
    ep.end, ep.error = "error", f"a prompt over the model's context: {state.refused[0]}"
  elif not calls:
    ep.end, ep.error = "error", f"no call of the harness was served{refused}"
  else:
    ep.turn_rewards, ep.turn_ends = [result.reward], [_last_policy(ep)]
    ep.correct, ep.infos, ep.end = result.correct, [result.info], "done"


def _last_policy(ep: Episode) -> int:
  policy = np.flatnonzero(np.asarray(ep.source) == 1)
  return int(policy[-1]) if policy.size else 0


register_episode_engine(harness_lib.ENDPOINT_ENGINE, reads=("env.slots", "env.harness_workers"))(
    EndpointEngine)

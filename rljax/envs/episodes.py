"""The turn-synchronous multi-turn rollout driver: token ids in, token ids out.

For ``Pn`` problems and ``G`` rows per problem (each row its own trajectory):

1. ``reset`` every problem's environment (in a worker process); its first observation is the
   prompt, encoded once (``encode_prompt``) and left-padded: ``Rollout.prompt_tokens``.
2. Turn after turn, ``generate`` continues the rows still running, each from the exact token ids
   of its trajectory so far (prompt, every sampled id, every observation id; never decoded and
   re-encoded). The first turn samples ``G`` continuations of each prompt; later ones one per row.
   A turn stops at EOS or at the last token of the tool-call close marker (the sampler's stop
   ids), or after ``rollout.max_new_tokens`` tokens. If the stop token was no close marker in
   context (a multi-token marker), the row keeps generating the same turn. With hermes calls and
   a chat template (``message_turns``) a turn is a whole assistant message: it stops at EOS only,
   so all the calls of one message run before the policy continues.
3. Each finished turn goes to its environment's ``step`` (in a worker, ``env.timeout_s``); the
   result is checked (``rljax.envs.validate``), the observation encoded alone (chat messages
   rendered by the chat template first: ``Tokenizer.render_followup``) and its ids appended as
   environment tokens.
4. A row ends when its environment says done, after ``env.max_turns`` turns, when its trajectory
   reaches ``env.max_tokens`` tokens (cut there, flagged ``truncated``), or when a step times out
   or fails (reward 0, counted).

The result is one ``Rollout``: ``tokens`` [B, T = env.max_tokens] are everything after the prompt
(policy and environment tokens, padding after the end), ``mask`` is 1 on policy tokens only (the
losses never see observations), ``sampler_logp`` / ``draw_logp`` are the sampler's on policy
tokens and 0 elsewhere, ``extras['source']`` [B, T] int32 says who wrote each position
(``SOURCE_PAD`` 0, ``SOURCE_POLICY`` 1, ``SOURCE_ENV`` 2; the trainer's forward attends to
every non-padding position), ``rewards`` the sum of the turns' rewards, ``correct`` the final
step's ``info['correct']``, ``lengths`` the policy tokens per row (``sum(mask)``).

``generate(tokens [N, W], mask [N, W], key, sampling, group_size) -> Rollout`` (NumPy) is the one
call that produces tokens: the train loop passes its rollout engine's (``rljax.envs.drivers``),
tests pass ``rljax.rollout.sampler.sample``. The continuous engine
(``rljax.envs.async_turns``, ``env.engine='async_turns'``) replaces this loop, not only
``generate``, and shares its bookkeeping (``start_episodes``, ``end_segment``, ``apply_step``,
``finish_episodes``), so both write the same record. Row counts are padded to a few sizes
(``B, B/2, B/4, B/8``) and widths to multiples of ``WIDTH_BUCKET``, so a run compiles the sampler
a handful of times.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, List, Optional, Sequence

import jax  # the driver's only JAX use: folding the key per turn
import numpy as np

from rljax.envs import tools as tools_lib
from rljax.envs import validate
from rljax.envs.base import Environment, make_env
from rljax.envs.runner import EnvOutcome, EnvRunner
from rljax.rollout.text import left_pad
from rljax.rollout.record import Rollout

SOURCE_PAD, SOURCE_POLICY, SOURCE_ENV = 0, 1, 2
WIDTH_BUCKET = 32  # continuation prompts are left-padded to a multiple of this
ROW_SPLITS = 3  # row counts of later turns: B, B/2, ..., B/2**ROW_SPLITS

GenerateFn = Callable[..., Any]  # (tokens, mask, key, sampling, group_size) -> Rollout


@dataclasses.dataclass(frozen=True)
class EnvSettings:
  """The ``env`` section (and the worker settings of ``reward``) as the driver uses it."""
  name: str
  max_turns: int = 4
  max_tokens: int = 256
  timeout_s: float = 5.0
  tool_format: str = "compact"
  workers: int = 4
  max_worker_memory_mb: int = 0
  worker_max_calls: int = 0
  engine: str = "turn_sync"  # or 'async_turns' (rljax.envs.async_turns), 'endpoint'
  slots: int = 0  # the async_turns and endpoint engines' lanes; 0: every row
  harness_workers: int = 16  # the endpoint engine's harness processes (episodes in flight)
  turn_discount: float = 1.0  # < 1: per-turn token rewards, discounted across turns
  # The most tokens a first observation may hold (the model's context less ``max_tokens``,
  # ``data.max_prompt_tokens``: ``rljax.data.prompt_policy``); 0: no limit.
  max_prompt_tokens: int = 0

  @classmethod
  def from_config(cls, config) -> Optional["EnvSettings"]:
    """None when ``env.name`` is None (single-turn rollouts)."""
    e, r = config.env, config.reward
    if e.name is None:
      return None
    return cls(name=e.name, max_turns=e.max_turns, max_tokens=e.max_tokens,
               timeout_s=e.timeout_s, tool_format=e.tool_format, workers=r.workers,
               max_worker_memory_mb=r.max_worker_memory_mb,
               worker_max_calls=r.worker_max_calls, engine=e.engine, slots=e.slots,
               harness_workers=e.get("harness_workers", cls.harness_workers),
               turn_discount=e.turn_discount)

  @property
  def runner(self) -> EnvRunner:
    return EnvRunner(self.timeout_s, self.workers, self.max_worker_memory_mb,
                     self.worker_max_calls)

  def new_env(self) -> Environment:
    return make_env(self.name, max_turns=self.max_turns, tool_format=self.tool_format)


@dataclasses.dataclass
class Episode:
  """One trajectory on the host while it runs, and its account afterwards.

  ``ids`` / ``source`` / ``sampler_logp`` / ``draw_logp``: every position after the prompt.
  ``end``: '' while running, then 'done' (the environment ended it), 'max_turns', 'max_tokens',
  'timeout' or 'error' (a failed reset or step: ``error`` says why).
  """
  problem: int  # index of its problem
  env: Any = None
  ids: List[int] = dataclasses.field(default_factory=list)
  source: List[int] = dataclasses.field(default_factory=list)
  sampler_logp: List[float] = dataclasses.field(default_factory=list)
  draw_logp: List[float] = dataclasses.field(default_factory=list)
  turn_start: int = 0  # where the turn being generated began (in ``ids``)
  turns: int = 0
  turn_rewards: List[float] = dataclasses.field(default_factory=list)
  turn_ends: List[int] = dataclasses.field(default_factory=list)  # each rewarded turn's last id
  tool_calls: int = 0
  tool_errors: int = 0
  correct: bool = False
  truncated: bool = False
  end: str = ""
  error: str = ""
  infos: List[dict] = dataclasses.field(default_factory=list)

  @property
  def running(self) -> bool:
    return not self.end

  @property
  def reward(self) -> float:
    return 0.0 if self.end in ("timeout", "error") else float(sum(self.turn_rewards))

  def append(self, ids, source: int, slp=None, dlp=None) -> None:
    ids = [int(i) for i in ids]
    self.ids += ids
    self.source += [source] * len(ids)
    self.sampler_logp += [0.0] * len(ids) if slp is None else [float(x) for x in slp]
    self.draw_logp += [0.0] * len(ids) if dlp is None else [float(x) for x in dlp]


@dataclasses.dataclass
class MultiTurnResult:
  rollout: Any  # Rollout (NumPy) with rewards, correct, row_valid and extras
  episodes: List[Episode]
  transcripts: List[str]  # decoded text after the prompt of every row (policy + observations)
  counts: dict  # env/* sums of the batch (rounds of a step add up)

  @property
  def failures(self) -> List[dict]:
    """``{"outcome": 'timeout' | 'error', "detail", "turn", "transcript"}`` of every episode a
    failed reset or step ended (``rljax.envs.failures`` reports them)."""
    return [{"outcome": ep.end, "detail": ep.error, "turn": ep.turns,
             "transcript": self.transcripts[i]}
            for i, ep in enumerate(self.episodes) if ep.end in ("timeout", "error")]


def message_turns(tokenizer, tool_format: str) -> bool:
  """Whether a turn is a whole assistant message: hermes calls with a chat template. Such a turn
  ends at EOS only (every call in it runs before the policy continues) and is answered by the
  chat template's tool messages and next assistant header (``Tokenizer.render_followup``)."""
  return tool_format == "hermes" and tokenizer.chat_turns


def turn_close(tokenizer, tool_format: str) -> Optional[str]:
  """The text that ends a turn holding a call (the tool format's close marker), or None where a
  turn is a whole message (``message_turns``)."""
  return None if message_turns(tokenizer, tool_format) else tools_lib.close_marker(tool_format)


def stop_ids(tokenizer, sampling, tool_format: str) -> tuple:
  """The sampler's stop ids for a turn: its own (EOS) plus the last id of the close marker
  (none where a turn is a whole message)."""
  base = tuple(sampling.stop_ids or (tokenizer.eos_id,))
  close = turn_close(tokenizer, tool_format)
  if close is None:
    return base
  return base + tuple(i for i in tokenizer.encode(close)[-1:] if i not in base)


def turn_text(tokenizer, ids: Sequence[int]) -> str:
  """The text of a turn as its environment reads it: a final EOS dropped, other special tokens
  kept (a tokenizer may hold ``<tool_call>`` / ``</tool_call>`` as special tokens)."""
  ids = list(ids)
  if ids and ids[-1] == tokenizer.eos_id:
    ids = ids[:-1]
  return tokenizer.decode(ids, skip_special_tokens=False)


def _row_bucket(n: int, total: int, multiple: int) -> int:
  """Rows of a later turn's sampler call: the smallest of ``total / 2**k`` (k <= ROW_SPLITS, a
  multiple of ``multiple``) that holds ``n`` rows."""
  best = total
  for k in range(1, ROW_SPLITS + 1):
    size = total >> k
    if total % (1 << k) or size < max(n, 1) or size % multiple:
      break
    best = size
  return best


def turn_sampling(sampling, tokenizer, settings: "EnvSettings"):
  """A turn's ``SamplingParams``: ``sampling`` with the tool-call close marker's last id added to
  the stop ids and the tokenizer's padding."""
  return dataclasses.replace(sampling, pad_id=tokenizer.pad_id,
                             stop_ids=stop_ids(tokenizer, sampling, settings.tool_format))


def new_counts() -> dict:
  return dict.fromkeys(("env/episodes", "env/turns", "env/tool_calls", "env/tool_errors",
                        "env/timeouts", "env/errors", "env/max_turns", "env/max_tokens",
                        "env/policy_tokens", "env/env_tokens"), 0.0)


def start_episodes(problems: Sequence, group_size: int, *, tokenizer, settings: EnvSettings,
                   runner: EnvRunner):
  """Reset one environment per problem (in the workers) and give each of its ``group_size``
  rows a copy: ``(first observations as ids [Pn], episodes [Pn * G])``. A failed reset ends its
  rows at once (``end`` 'timeout' / 'error'), with the problem's prompt as their observation; so
  does a first observation ``rljax.envs.validate`` refuses (empty, too long, ids outside the
  vocabulary)."""
  eos = tokenizer.eos_id
  resets = runner.reset([settings.new_env() for _ in problems], problems)
  prompts, start_env, reset_error = [], [], []
  for problem, outcome in zip(problems, resets):
    ids, why = None, ""
    if outcome.status == "ok":
      try:
        ids = validate.first_observation_ids(tokenizer, outcome.value, settings.max_prompt_tokens)
      except validate.EnvResultError as e:
        why = str(e)
      except Exception as e:  # e.g. a character the tokenizer lacks
        why = f"first observation not encodable: {type(e).__name__}: {str(e)[:200]}"
    else:
      why = outcome.value or f"reset took over {settings.timeout_s} s"
    if why:
      ids = tokenizer.encode_prompt(problem.prompt) or [eos]
      reset_error.append((outcome.status if outcome.status == "timeout" else "error", why))
    else:
      reset_error.append(None)
    prompts.append(ids)
    start_env.append(outcome.env)
  episodes = []
  for i in range(len(problems)):
    for _ in range(group_size):
      ep = Episode(problem=i, env=copy.deepcopy(start_env[i]) if reset_error[i] is None else None)
      if reset_error[i] is not None:
        ep.end, ep.error = reset_error[i]
      episodes.append(ep)
  return prompts, episodes


def end_segment(ep: Episode, ids, slp, dlp, stopped: bool, *, tokenizer, budget: int,
                close: Optional[str], counts: dict) -> str:
  """Append one sampler segment (``ids``: at most ``rollout.max_new_tokens``, ``stopped`` when
  its last id is a stop id) to its trajectory and say what follows: 'step' (the turn is
  complete: its environment steps), 'continue' (a stop id that closed no marker ``close``: the
  same turn goes on in a new segment; ``close`` None: every stop id ends the turn) or 'ended'
  (the trajectory reached ``budget`` tokens)."""
  n = len(ids)
  room = budget - len(ep.ids)
  cut = n > room
  n = min(n, room)
  ep.append(ids[:n], SOURCE_POLICY, slp[:n], dlp[:n])
  counts["env/policy_tokens"] += n
  if cut:
    ep.end, ep.truncated = "max_tokens", True
    return "ended"
  turn_ids = ep.ids[ep.turn_start:]
  if (stopped and close is not None and turn_ids[-1] != tokenizer.eos_id
      and not turn_text(tokenizer, turn_ids).endswith(close)):
    if len(ep.ids) >= budget:
      ep.end, ep.truncated = "max_tokens", True
      return "ended"
    return "continue"
  return "step"


def turn_action(ep: Episode, tokenizer) -> str:
  """What the environment reads of the turn just completed."""
  return turn_text(tokenizer, ep.ids[ep.turn_start:])


def finish_episodes(episodes: Sequence[Episode], prompts: Sequence[Sequence[int]], *,
                    tokenizer, group_size: int, prompt_bucket: int, budget: int,
                    counts: dict, turn_discount: float = 1.0) -> MultiTurnResult:
  """The ``MultiTurnResult`` of finished episodes: the record and the batch's ``env/*`` sums."""
  tally(episodes, counts)
  prompt_tokens, prompt_mask = left_pad(prompts, prompt_bucket, tokenizer.pad_id)
  g = group_size
  rollout = build_record(episodes, np.repeat(prompt_tokens, g, 0), np.repeat(prompt_mask, g, 0),
                         budget, tokenizer.pad_id, turn_discount=turn_discount)
  transcripts = [tokenizer.decode(ep.ids) for ep in episodes]
  return MultiTurnResult(rollout, episodes, transcripts, counts)


def tally(episodes: Sequence[Episode], counts: dict) -> dict:
  """The batch's ``env/*`` sums of finished episodes added to ``counts``."""
  counts["env/episodes"] = float(len(episodes))
  for ep in episodes:
    counts["env/turns"] += ep.turns
    counts["env/tool_calls"] += ep.tool_calls
    counts["env/tool_errors"] += ep.tool_errors
    counts["env/timeouts"] += ep.end == "timeout"
    counts["env/errors"] += ep.end == "error"
    counts["env/max_turns"] += ep.end == "max_turns"
    counts["env/max_tokens"] += ep.end == "max_tokens"
    counts["env/env_tokens"] += ep.source.count(SOURCE_ENV)
  return counts


def run_episodes(problems: Sequence, key, *, generate: GenerateFn, tokenizer, settings: EnvSettings,
                 sampling, group_size: int, prompt_bucket: int, row_multiple: int = 1,
                 runner: Optional[EnvRunner] = None) -> MultiTurnResult:
  """Multi-turn rollouts of ``group_size`` trajectories per problem (module docstring).

  Args:
    problems: [Pn] ``Problem``s.
    key: a ``jax.random`` key; turn ``k`` samples with ``fold_in(key, k)``.
    generate: ``(tokens, mask, key, sampling, group_size) -> Rollout`` (module docstring).
    tokenizer: ``encode``, ``encode_prompt``, ``decode``, ``eos_id``, ``pad_id``.
    settings: the environment and its limits.
    sampling: ``SamplingParams`` of a turn (``max_new_tokens`` per turn; stop ids extended here).
    group_size: ``G``; the result has ``B = Pn * G`` rows, groups contiguous.
    prompt_bucket: first prompts are left-padded to a multiple of this.
    row_multiple: every sampler call's row count is a multiple of this (data-parallel width).
    runner: where reset / step run (default: the settings' worker pool).
  """

  runner = runner or settings.runner
  pad = tokenizer.pad_id
  g = int(group_size)
  b, budget = len(problems) * g, int(settings.max_tokens)
  sp = turn_sampling(sampling, tokenizer, settings)
  close = turn_close(tokenizer, settings.tool_format)
  counts = new_counts()

  # 1. Reset (one environment per problem; its G rows get copies of it).
  prompts, episodes = start_episodes(problems, g, tokenizer=tokenizer, settings=settings,
                                     runner=runner)
  prompt_tokens, prompt_mask = left_pad(prompts, prompt_bucket, pad)

  # 2-4. Turns.
  round_ = 0
  while True:
    if not any(ep.running for ep in episodes):  # every reset failed, or every episode ended
      break
    if round_ == 0:
      rows = list(range(b))
      out = generate(prompt_tokens, prompt_mask, jax.random.fold_in(key, 0), sp, g)
      row_of = {r: r for r in rows}
    else:
      rows = [r for r, ep in enumerate(episodes) if ep.running]
      width = _row_bucket(len(rows), b, row_multiple)
      seqs = [prompts[episodes[r].problem] + episodes[r].ids for r in rows]
      seqs += [seqs[0]] * (width - len(rows))  # filler rows, their output unused
      tokens, mask = left_pad(seqs, WIDTH_BUCKET, pad)
      out = generate(tokens, mask, jax.random.fold_in(key, round_), sp, 1)
      row_of = {r: j for j, r in enumerate(rows)}
    round_ += 1
    out_tokens, out_len = np.asarray(out.tokens), np.asarray(out.lengths)
    out_slp, out_dlp = np.asarray(out.sampler_logp), np.asarray(out.draw_logp)
    out_trunc = np.asarray(out.truncated)
    stepping = []  # rows whose turn is complete: their environments step
    for r, j in row_of.items():
      ep = episodes[r]
      if not ep.running:
        continue
      n = int(out_len[j])
      what = end_segment(ep, out_tokens[j, :n], out_slp[j, :n], out_dlp[j, :n],
                         not bool(out_trunc[j]), tokenizer=tokenizer, budget=budget,
                         close=close, counts=counts)
      if what == "step":
        stepping.append(r)

    actions = [turn_action(episodes[r], tokenizer) for r in stepping]
    outcomes = runner.step([episodes[r].env for r in stepping], actions)
    for r, outcome in zip(stepping, outcomes):
      apply_step(episodes[r], outcome, tokenizer, settings, budget, counts)

  return finish_episodes(episodes, prompts, tokenizer=tokenizer, group_size=g,
                         prompt_bucket=prompt_bucket, budget=budget, counts=counts,
                         turn_discount=settings.turn_discount)


def apply_step(ep: Episode, outcome: EnvOutcome, tokenizer, settings: EnvSettings, budget: int,
                counts: dict) -> None:
  """One environment step's result on its trajectory."""
  if outcome.status != "ok":
    ep.end = "timeout" if outcome.status == "timeout" else "error"
    ep.error = outcome.value or f"step took over {settings.timeout_s} s"
    ep.env = None
    return
  observation, reward, done, info = outcome.value
  ep.env = outcome.env
  ep.turns += 1
  ep.turn_rewards.append(float(reward))
  ep.turn_ends.append(len(ep.ids) - 1)
  ep.infos.append(info)
  ep.tool_calls += info.get("tool_calls", 0)  # counts checked in the worker (validate)
  ep.tool_errors += info.get("tool_errors", 0)
  if done:
    ep.end, ep.correct = "done", info.get("correct", False)
    return
  if ep.turns >= settings.max_turns:
    ep.end = "max_turns"
    return
  try:
    ids = validate.observation_ids(tokenizer, observation, budget - len(ep.ids))
  except validate.EnvResultError as e:
    ep.end, ep.error = "error", str(e)
    return
  except Exception as e:
    ep.end, ep.error = "error", f"observation not encodable: {type(e).__name__}: {str(e)[:200]}"
    return
  if (observation and isinstance(observation[0], dict) and tokenizer.chat_turns
      and ep.ids[-1] != tokenizer.eos_id):
    # A turn cut at rollout.max_new_tokens: its message is closed as the chat template closes
    # one, so that the messages after it read as they do after EOS.
    ids = [tokenizer.eos_id] + ids
  if len(ep.ids) + len(ids) >= budget:  # no room left for the policy's next turn
    ep.append(ids[:budget - len(ep.ids)], SOURCE_ENV)
    ep.end, ep.truncated = "max_tokens", True
    return
  ep.append(ids, SOURCE_ENV)
  ep.turn_start = len(ep.ids)


def turn_token_rewards(turn_rewards: Sequence[float], turn_ends: Sequence[int], gamma: float,
                       t: int) -> np.ndarray:
  """Per-token rewards [T] of one trajectory whose returns are discounted across turns.

  With ``R_k = r_k + gamma R_{k+1}`` the turn-discounted return from turn ``k`` (``r_k`` its
  reward, ``R`` after the last turn 0), ``x_k = R_k - R_{k+1}`` is placed at turn ``k``'s last
  policy token (``turn_ends[k]``). The returns-to-go of a token estimator (REINFORCE++, GAE
  with ``algo.gamma = 1``) then telescope: every token of turn ``k`` sees ``sum_{j >= k} x_j =
  R_k = sum_{j >= k} gamma^(j-k) r_j``, its own turn's reward and the later ones discounted by
  turns, not tokens (a long turn is not discounted more than a short one)."""
  out = np.zeros(t, np.float32)
  later = 0.0  # R_{k+1}
  for reward, end in reversed(list(zip(turn_rewards, turn_ends))):
    here = float(reward) + gamma * later
    out[end] += here - later
    later = here
  return out


def build_record(episodes: Sequence[Episode], prompt_tokens: np.ndarray, prompt_mask: np.ndarray,
                 t: int, pad_id: int, turn_discount: float = 1.0):
  """The ``Rollout`` of finished episodes (module docstring), NumPy, rewards included. With
  ``turn_discount < 1`` (``env.turn_discount``) ``extras['token_rewards']`` [B, T] holds each
  row's ``turn_token_rewards`` (zeros for a failed episode, whose reward is 0), which the
  token-level estimators read instead of the outcome on the last token."""
  b = len(episodes)
  tokens = np.full((b, t), pad_id, np.int32)
  source = np.zeros((b, t), np.int32)
  slp = np.zeros((b, t), np.float32)
  dlp = np.zeros((b, t), np.float32)
  for i, ep in enumerate(episodes):
    n = len(ep.ids)
    tokens[i, :n] = ep.ids
    source[i, :n] = ep.source
    slp[i, :n] = ep.sampler_logp
    dlp[i, :n] = ep.draw_logp
  mask = (source == SOURCE_POLICY).astype(np.int32)
  ints = lambda f: np.asarray([f(ep) for ep in episodes], np.int32)
  return Rollout(
      prompt_tokens=np.asarray(prompt_tokens, np.int32), prompt_mask=np.asarray(prompt_mask,
                                                                                np.int32),
      tokens=tokens, mask=mask, sampler_logp=slp, draw_logp=dlp,
      lengths=mask.sum(1, dtype=np.int32),
      truncated=np.asarray([ep.truncated for ep in episodes], bool),
      rewards=np.asarray([ep.reward for ep in episodes], np.float32),
      correct=np.asarray([ep.correct for ep in episodes], bool),
      row_valid=np.ones(b, np.float32),
      extras={"source": source, "env_turns": ints(lambda ep: ep.turns),
              "env_tool_calls": ints(lambda ep: ep.tool_calls),
              "env_tool_errors": ints(lambda ep: ep.tool_errors),
              **({} if turn_discount >= 1.0 else {"token_rewards": np.stack([
                  turn_token_rewards(ep.turn_rewards if ep.end not in ("timeout", "error")
                                     else [], ep.turn_ends, turn_discount, t)
                  for ep in episodes])})})


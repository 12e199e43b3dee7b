"""Continuous batching across turns (``env.engine='async_turns'``) against independent references:
a full teacher-forced forward of the finished trajectory (what re-prefilling it computes), the
turn-synchronous driver around the all-rows sampler, and the device's own draws. One tiny model
and one set of shapes for the whole module (compiled once)."""
import dataclasses
import os
import time

import jax
import numpy as np
import pytest

from rljax.data.tasks import Problem, make_task
from rljax.envs import ENVS, Environment, StepResult, register_env
from rljax.envs import async_turns as engine_lib
from rljax.envs.episodes import (SOURCE_ENV, SOURCE_POLICY, EnvSettings, run_episodes,
                                turn_text)
from rljax.models import transformer
from rljax.rollout import sampler
from rljax.learner import step as step_lib
from tests.envs.test_driver import SP, TALKER, TOK, tiny_model_config

MOODY = "test_moody"

if MOODY not in ENVS:
  @register_env(MOODY)  # module level: the workers unpickle it by reference
  class Moody(Environment):
    """Talker's answers, except that the first step of a problem whose prompt starts with
    'hang' / 'crash' / 'junk' hangs, kills its process or returns garbage (unless ``calm``)."""
    calm = False

    def reset(self, problem):
      self.mood, self.turn = problem.prompt.split(" ")[0], 0
      return problem.prompt

    def step(self, action):
      self.turn += 1
      if not self.calm and self.turn == 1:
        if self.mood == "hang":
          time.sleep(3600)
        if self.mood == "crash":
          os._exit(3)
        if self.mood == "junk":
          return object()
      return StepResult(f" {len(action)} ok:", 0.5, False, {})

  @register_env(MOODY + "_calm")
  class Calm(Moody):
    calm = True


BUDGET = 32  # env.max_tokens: 3 turns of up to 8 tokens and their answers overflow it at times
SP8 = dataclasses.replace(SP, max_new_tokens=8)


@pytest.fixture(scope="module")
def policy():
  """A 1-layer model whose weights are scaled up so that its argmax depends on the context
  (at init scale every row greedily repeats one character)."""
  cfg = tiny_model_config()
  return cfg, jax.tree.map(lambda x: 4.0 * x, transformer.init_params(cfg, seed=0))


def _problems(n=3):
  return [make_task("tool_calc", 0).problem_at(0, i) for i in range(n)]


def _settings(name=TALKER, **kw):
  return EnvSettings(**{"name": name, "max_turns": 3, "max_tokens": BUDGET, "workers": 2, **kw})


def _continuous(policy, problems, sp, slots=4, settings=None, stats=None, runner=None, key=3):
  cfg, params = policy
  return engine_lib.run_async_episodes(
      problems, jax.random.PRNGKey(key), cfg=cfg, params=params, tokenizer=TOK,
      settings=settings or _settings(), sampling=sp, group_size=2, prompt_bucket=16,
      slots=slots, stats=stats, runner=runner)


def _reference_logp(policy, rollout):
  """Log-probs [B, S, V] of a full causal forward over prompt + trajectory (no cache)."""
  cfg, params = policy
  tokens, attn = step_lib.sequence_inputs(rollout)
  return np.asarray(jax.nn.log_softmax(transformer.logits(cfg, params, tokens, attn), -1))


def _check_against_full_forward(policy, rollout, greedy: bool):
  ref = _reference_logp(policy, rollout)
  p = rollout.prompt_tokens.shape[1]
  rows, cols = np.nonzero(rollout.mask)
  pred = ref[rows, p + cols - 1]  # position s predicts token s + 1
  np.testing.assert_allclose(pred[np.arange(len(rows)), rollout.tokens[rows, cols]],
                             rollout.sampler_logp[rows, cols], atol=1e-5)
  if greedy:
    np.testing.assert_array_equal(pred.argmax(-1), rollout.tokens[rows, cols])


def test_cache_continuation_equals_full_prefill(policy):
  """Every policy token of three-turn trajectories, drawn from a cache continued across turns
  (prompt prefill, decode, observation prefills), has the log-prob that one causal forward over
  the whole trajectory gives it (to 1e-5). (Greedy: ``test_same_greedy_trajectories...``.)"""
  result = _continuous(policy, _problems(), SP8)
  r = result.rollout
  assert max(ep.turns for ep in result.episodes) == 3
  assert (r.extras["source"] == SOURCE_ENV).sum(1).min() > 0
  _check_against_full_forward(policy, r, greedy=False)


def test_token_in_token_out_three_turns(policy, monkeypatch):
  """What the trainer reads is exactly what the sampler conditioned on and drew: per row, the
  ids fed to the device (prompt, last token + observation, ...) and the ids it drew, in order,
  are the record's prompt + trajectory; observations are the encoded environment answers."""
  fed, drawn = {}, {}
  run = engine_lib.turns.run_lanes

  def spy(weights, store, lanes, queue, *args, **kw):
    m = store[0][0].shape[0]  # (the store is donated to the call)
    store, out = run(weights, store, lanes, queue, *args, **kw)
    # Records: the lanes (fed their last token), then the queued rows (fed their chunks).
    feeds = [[int(t)] for t in lanes["tok"]] + [
        list(c[k > 0]) for c, k in zip(np.asarray(queue["chunk"]), np.asarray(queue["mask"]))]
    for i, r in enumerate(np.concatenate([lanes["idx"], queue["idx"]])):
      n = int(out["count"][i])
      if r < m and n:  # its chunk (entering) or last token, then each one drawn but the last
        got = np.asarray(out["tokens"])[i, :n].tolist()
        fed.setdefault(int(r), []).extend(feeds[i])
        fed[int(r)].extend(got[:-1])
        drawn.setdefault(int(r), []).extend(got)
    return store, out
  monkeypatch.setattr(engine_lib.turns, "run_lanes", spy)
  result = _continuous(policy, _problems(), SP8)
  r = result.rollout
  tokens, attn = (np.asarray(x) for x in step_lib.sequence_inputs(r))
  for row, ep in enumerate(result.episodes):
    trainer = tokens[row][attn[row] > 0].tolist()
    source = r.extras["source"][row][r.extras["source"][row] > 0]
    assert [int(i) for i in trainer] == list(r.prompt_tokens[row][r.prompt_mask[row] > 0]) + \
        ep.ids
    # The device drew the policy tokens (and, at a cut, a few more that were dropped) ...
    policy_ids = [i for i, s in zip(ep.ids, source) if s == SOURCE_POLICY]
    assert drawn[row][:len(policy_ids)] == policy_ids
    # ... and was fed the trainer's sequence up to its last token, each id once, in order.
    assert [int(i) for i in fed[row]] == trainer[:len(fed[row])]
    assert len(fed[row]) >= len(trainer) - 1
    # Each observation is the encoded answer to the turn before it.
    pos, turn_start = 0, 0
    while pos < len(ep.ids):
      end = pos
      while end < len(ep.ids) and source[end] == source[pos]:
        end += 1
      if source[pos] == SOURCE_ENV:
        action = turn_text(TOK, ep.ids[turn_start:pos])
        assert ep.ids[pos:end] == TOK.encode(f" {len(action)} ok:")[:end - pos]
        turn_start = end
      pos = end
  assert result.counts["env/turns"] >= 2 * len(result.episodes)


def test_same_greedy_trajectories_as_turn_sync(policy):
  """The two engines write the same record for greedy decoding: the turn-synchronous driver
  re-prefills every trajectory at every turn through the all-rows sampler."""
  cfg, params = policy

  def generate(tokens, mask, key, sp, group_size):
    return jax.tree.map(np.asarray, sampler.sample(cfg, params, tokens, mask, key, sp,
                                                   group_size))
  sp = dataclasses.replace(SP8, greedy=True)
  problems = _problems()
  sync = run_episodes(problems, jax.random.PRNGKey(3), generate=generate, tokenizer=TOK,
                      settings=_settings(), sampling=sp, group_size=2, prompt_bucket=16)
  cont = _continuous(policy, problems, sp)  # 4 lanes for 6 rows: rows queue, lanes narrow
  a, b = sync.rollout, cont.rollout
  _check_against_full_forward(policy, b, greedy=True)
  assert len(set(sync.transcripts)) > 1 and any(e.truncated for e in sync.episodes)
  for field in ("prompt_tokens", "prompt_mask", "tokens", "mask", "lengths", "truncated",
                "rewards"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
  for name in a.extras:
    np.testing.assert_array_equal(a.extras[name], b.extras[name], err_msg=name)
  np.testing.assert_allclose(a.sampler_logp, b.sampler_logp, atol=1e-5)
  assert sync.counts == cont.counts


def test_sampled_rollout_does_not_depend_on_lanes(policy):
  """A row's draws depend on its own segments only: 2 lanes and 4 lanes (other rows, other
  arrival orders) give the same sampled rollout, and the engine's accounting adds up."""
  stats = engine_lib.EngineStats()
  narrow = _continuous(policy, _problems(), SP8, slots=2, stats=stats, key=5)
  wide = _continuous(policy, _problems(), SP8, slots=4, key=5)
  np.testing.assert_array_equal(narrow.rollout.tokens, wide.rollout.tokens)
  np.testing.assert_allclose(narrow.rollout.sampler_logp, wide.rollout.sampler_logp, atol=1e-5)
  assert stats.drawn >= narrow.counts["env/policy_tokens"] > 0  # a cut drops drawn tokens
  # Each decode step computes at most 2 lanes, each admission 1 row (``refill_rows`` 2 // 8 -> 1).
  assert stats.drawn <= stats.computed <= 2 * stats.steps + stats.admissions
  assert stats.admissions > 0
  assert stats.prefilled_tokens > 0


def test_rows_admitted_inside_a_call_draw_what_admission_at_a_call_start_draws(policy,
                                                                             monkeypatch):
  """Queued rows take free lanes inside a call (16 steps per call: most enter after its first
  step) or before a call's first step (1 step per call: the host's refill, as before lanes
  were refilled inside calls; 3 steps: 8-token segments also span calls): the same sampled
  rollout, and the long calls need fewer round trips."""
  got, stats = {}, {}
  default = engine_lib.DECODE_STEPS
  for steps in (default, 3, 1):
    monkeypatch.setattr(engine_lib, "DECODE_STEPS", steps)
    stats[steps] = engine_lib.EngineStats()
    got[steps] = _continuous(policy, _problems(), SP8, slots=2, stats=stats[steps], key=5)
  ref = got[1].rollout
  for steps in got:
    np.testing.assert_array_equal(got[steps].rollout.tokens, ref.tokens)
    np.testing.assert_array_equal(got[steps].rollout.mask, ref.mask)
    np.testing.assert_allclose(got[steps].rollout.sampler_logp, ref.sampler_logp, atol=1e-5)
    assert stats[steps].drawn == stats[1].drawn
    assert stats[steps].admissions == stats[1].admissions  # one per segment (1 lane per chunk)
  assert stats[default].calls < stats[1].calls / 2


class _Clock:
  """An ``EnvRunner`` that notes when each step's answer arrived."""

  def __init__(self, runner):
    self.runner, self.seen = runner, []

  def __getattr__(self, name):
    return getattr(self.runner, name)

  def poll(self, wait_s=0.0):
    got = self.runner.poll(wait_s)
    self.seen += [(tag, outcome.status, time.monotonic()) for tag, outcome in got]
    return got


def test_failures_cost_only_their_row(policy):
  """A step that hangs, kills its worker or returns garbage ends its own row (reward 0,
  counted); the other rows go on meanwhile, to the trajectories they have when no step fails."""
  problems = [Problem(prompt=p + " 1*2=", answer="2") for p in ("fine", "hang", "crash", "junk")]
  sp = dataclasses.replace(SP8, greedy=True)
  settings = _settings(MOODY, timeout_s=5.0, workers=4)
  calm = _continuous(policy, problems, sp, settings=_settings(MOODY + "_calm", workers=4))
  clock = _Clock(settings.runner)
  moody = _continuous(policy, problems, sp, settings=settings, runner=clock)
  ends = [ep.end for ep in moody.episodes]
  assert ends[2:] == ["timeout"] * 2 + ["error"] * 4, ends
  assert "died" in moody.episodes[4].error and "StepResult" in moody.episodes[6].error
  np.testing.assert_array_equal(moody.rollout.rewards[2:], 0)
  for row in (0, 1):
    assert moody.episodes[row].end == calm.episodes[row].end != ""
    np.testing.assert_array_equal(moody.rollout.tokens[row], calm.rollout.tokens[row])
  assert moody.counts["env/timeouts"] == 2 and moody.counts["env/errors"] == 4
  # While the hung steps ran, the fine rows went on to later turns: more of their steps were
  # answered than their first ones (the turn-synchronous driver waits for the hang instead).
  first_timeout = min(t for _, status, t in clock.seen if status == "timeout")
  assert sum(tag in (0, 1) and t < first_timeout for tag, _, t in clock.seen) > 2

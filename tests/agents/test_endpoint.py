"""The OpenAI-compatible endpoint (``env.engine='endpoint'``) against independent references:
harnesses written with the official ``openai`` client play episodes against a tiny policy; every
recorded call is checked against what the device drew (a spy on ``run_lanes``) and against a full
teacher-forced forward of the call's own prompt + answer (no cache), the record's stitching
against the rule recomputed from the calls, and the trainer's forward over the record against
the sampler's log-probs. One tiny model, one engine, shapes compiled once for the module."""
import dataclasses
import os
import time

import jax
import numpy as np
import openai
import pytest

from rljax.agents import driver as driver_lib
from rljax.agents import harness as harness_lib
from rljax.agents import serving
from rljax.agents.harness import register_harness
from rljax.data.tasks import Problem
from rljax.envs.episodes import SOURCE_ENV, SOURCE_POLICY, EnvSettings
from rljax.learner import packing
from rljax.learner import step as step_lib
from rljax.models import transformer
from rljax.rollout.engines import JaxEngine
from tests.envs.test_driver import SP, TOK, tiny_model_config

G, BUDGET = 2, 64
SP8 = dataclasses.replace(SP, max_new_tokens=8)
GREEDY = dataclasses.replace(SP8, greedy=True)


def _client(task):
  return openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0, timeout=120)


if "t_extend" not in harness_lib.HARNESSES:
  @register_harness("t_extend")  # module level: the forked workers find it by name
  def t_extend(task):
    """Three calls, each the history so far (kept as the ids it was answered with) plus
    ' ok:'; returns the texts it was answered."""
    client, seen = _client(task), []
    ids = TOK.encode_prompt(task.problem.prompt)
    for _ in range(3):
      out = client.completions.create(model=task.model, prompt=ids, max_tokens=5)
      choice = out.choices[0]
      seen.append(choice.text)
      ids = choice.prompt_token_ids + choice.token_ids + TOK.encode(" ok:")
    return {"reward": len(seen) / 4, "correct": True, "info": {"seen": seen}}

  @register_harness("t_text")
  def t_text(task):
    """Three calls, each the transcript so far (text) plus ' ok:'."""
    client, text = _client(task), task.problem.prompt
    for _ in range(3):
      out = client.completions.create(model=task.model, prompt=text, max_tokens=5, stop=["#"])
      text += out.choices[0].text + " ok:"
    return 0.25

  @register_harness("t_rerender")
  def t_rerender(task):
    """Three calls whose prompts drop the previous answer: no call extends the one before."""
    client = _client(task)
    for k in range(3):
      client.completions.create(model=task.model, prompt=task.problem.prompt + " a" * (k + 1),
                                max_tokens=4)
    return 0.5

  @register_harness("t_faults")
  def t_faults(task):
    """Row behaviour by prompt: crash, hang, a prompt over the context, a request the endpoint
    refuses (n=2), no call at all, or one good call."""
    mood = task.problem.prompt.split(" ")[0]
    client = _client(task)
    if mood == "crash":
      client.completions.create(model=task.model, prompt=task.problem.prompt, max_tokens=2)
      raise RuntimeError("the agent crashed")
    if mood == "hang":
      time.sleep(3600)
    if mood == "long":
      client.completions.create(model=task.model, prompt="1" * 400, max_tokens=2)
    if mood == "many":
      client.completions.create(model=task.model, prompt=task.problem.prompt, max_tokens=2, n=2)
    if mood == "silent":
      return 1.0
    if mood == "die":
      os._exit(7)
    client.completions.create(model=task.model, prompt=task.problem.prompt, max_tokens=2)
    return 1.0


@pytest.fixture(scope="module")
def policy():
  cfg = tiny_model_config()
  return cfg, jax.tree.map(lambda x: 4.0 * x, transformer.init_params(cfg, seed=0))


@pytest.fixture(scope="module")
def engine(policy):
  cfg, params = policy
  base = JaxEngine(cfg)
  base.load_weights(params, 7)
  settings = EnvSettings(name="t_extend", engine="endpoint", max_turns=4, max_tokens=BUDGET,
                         timeout_s=60.0, harness_workers=4, slots=4, max_prompt_tokens=100)
  eng = driver_lib.EndpointEngine(base, settings, TOK, prompt_bucket=16)
  yield eng
  eng.close()
  harness_lib.close_harness_pool()


def _problems(*prompts):
  return [Problem(prompt=p, answer="0") for p in prompts]


def _run(engine, name, problems, sp=SP8, timeout_s=60.0):
  engine.settings = dataclasses.replace(engine.settings, name=name, timeout_s=timeout_s)
  return engine.episodes(problems, jax.random.PRNGKey(3), sp, G)


_logits = jax.jit(transformer.logits, static_argnums=0)
WIDTH = 128  # every reference forward is this wide (one compilation), right-padded


def _teacher_forced(policy, ids):
  """Log-probs [len(ids), V] of one causal forward over ``ids`` alone (no cache)."""
  cfg, params = policy
  tokens = np.zeros((1, WIDTH), np.int32)
  tokens[0, :len(ids)] = ids
  logits = _logits(cfg, params, tokens, (np.arange(WIDTH) < len(ids))[None].astype(np.int32))
  return np.asarray(jax.nn.log_softmax(logits, -1))[0, :len(ids)]


@pytest.fixture(scope="module")
def drawn_and_result(engine, policy):
  """Greedy episodes of ``t_extend`` with a spy on the device: per store row, every id drawn."""
  drawn = {}
  run = serving.turns.run_lanes

  def spy(weights, store, lanes, queue, *args, **kw):
    store, out = run(weights, store, lanes, queue, *args, **kw)
    for i, r in enumerate(np.concatenate([lanes["idx"], queue["idx"]])):
      n = int(out["count"][i])
      if n and r < 2 * G:
        drawn.setdefault(int(r), []).extend(np.asarray(out["tokens"])[i, :n].tolist())
    return store, out
  serving.turns.run_lanes = spy
  try:
    result = _run(engine, "t_extend", _problems("12*3=", "45*67="), sp=GREEDY)
  finally:
    serving.turns.run_lanes = run
  return drawn, result


def test_every_call_records_what_the_device_drew_and_the_policy_assigns(drawn_and_result, policy):
  """Per call: the answer ids are the ids the device drew for that row, in order; each answer token is the argmax of a
  teacher-forced forward over that call's own prompt + answer (greedy) and its recorded
  sampler log-prob equals that forward's (1e-5); the weights' version is the engine's."""
  drawn, result = drawn_and_result
  for row, calls in enumerate(result.calls):
    assert len(calls) == 3
    answered = []
    for call in calls:
      answered += call.completion_ids
      ids = call.prompt_ids + call.completion_ids
      logp = _teacher_forced(policy, ids)
      p = len(call.prompt_ids)
      pred = logp[p - 1:len(ids) - 1]
      np.testing.assert_array_equal(pred.argmax(-1), call.completion_ids)
      np.testing.assert_allclose(pred[np.arange(len(call.completion_ids)), call.completion_ids],
                                 call.sampler_logp, atol=1e-5)
      assert call.version == 7
    assert drawn[row] == answered  # no stop strings: every drawn id is recorded


def test_the_harness_saw_the_recorded_answers_and_its_reward_is_the_rows(drawn_and_result):
  drawn, result = drawn_and_result
  for ep, calls in zip(result.episodes, result.calls):
    assert ep.infos[0]["seen"] == [TOK.decode(c.completion_ids) for c in calls]  # no specials
    assert ep.end == "done" and ep.reward == 0.75
  np.testing.assert_array_equal(result.rollout.rewards, [0.75] * 2 * G)


def test_stitched_rows_are_the_calls_and_the_mask_covers_exactly_the_policy_tokens(
    drawn_and_result, policy):
  """A stitched row is the first call's prompt, then each call's answer (mask 1) and the next
  prompt's new ids (mask 0): rebuilt from the calls alone, position by position; the trainer's
  forward over the row gives the sampler's log-probs on every masked token."""
  _, result = drawn_and_result
  r = result.rollout
  for row, calls in enumerate(result.calls):
    prompt = r.prompt_tokens[row][r.prompt_mask[row] > 0].tolist()
    assert prompt == calls[0].prompt_ids
    want_ids, want_mask = [], []
    for k, call in enumerate(calls):
      if k:
        before = calls[k - 1].prompt_ids + calls[k - 1].completion_ids
        assert call.prompt_ids[:len(before)] == before  # the harness extends: one segment
        new = call.prompt_ids[len(before):]
        want_ids += new
        want_mask += [0] * len(new)
      want_ids += call.completion_ids
      want_mask += [1] * len(call.completion_ids)
    n = len(want_ids)
    assert r.tokens[row, :n].tolist() == want_ids
    assert r.mask[row].tolist() == want_mask + [0] * (BUDGET - n)
    assert (r.extras["segment"][row, :n] == 1).all() and (r.extras["segment"][row, n:] == 0).all()
    np.testing.assert_allclose(r.sampler_logp[row, :n][np.asarray(want_mask) > 0],
                               sum((c.sampler_logp for c in calls), []), atol=0)
  _trainer_matches_sampler(policy, r)
  assert result.counts["agent/split_episodes"] == 0 and result.counts["agent/calls"] == 3 * 2 * G


def _trainer_matches_sampler(policy, r):
  """The trainer's log-probs (``completion_stats`` over ``sequence_inputs``), padded and packed,
  equal the sampler's on every policy token (1e-5)."""
  cfg, params = policy
  logp, _ = step_lib.completion_stats(cfg, params, r, chunk=64)
  m = r.mask > 0
  np.testing.assert_allclose(np.asarray(logp)[m], r.sampler_logp[m], atol=1e-5)
  _, valid = step_lib.sequence_inputs(r)
  shape = packing.chunk_shape(r.tokens.shape[0], valid.shape[1], 2)
  packed = step_lib.Packed(packing.layout(valid, shape))
  logp, _ = step_lib.completion_stats(cfg, params, r, chunk=64, split=packed)
  np.testing.assert_allclose(np.asarray(logp)[m], r.sampler_logp[m], atol=1e-5)


def test_a_harness_that_rerenders_its_history_is_kept_as_separate_samples(engine, policy):
  """Calls that do not extend the previous one start new segments of the row: each holds its
  call's whole prompt (environment tokens) and answer (policy tokens); the trainer's forward
  restarts positions and attention per segment, so its log-probs equal the sampler's, and the
  episode's reward is on the one row."""
  result = _run(engine, "t_rerender", _problems("12*3=", "45*67="))
  r = result.rollout
  assert result.counts["agent/split_episodes"] == 2 * G
  assert result.counts["agent/samples"] == 3 * 2 * G
  for row, calls in enumerate(result.calls):
    seg, src = r.extras["segment"][row], r.extras["source"][row]
    at = len(calls[0].completion_ids)
    for k, call in enumerate(calls[1:], start=2):
      n_prompt, n_answer = len(call.prompt_ids), len(call.completion_ids)
      assert r.tokens[row, at:at + n_prompt].tolist() == call.prompt_ids
      assert (src[at:at + n_prompt] == SOURCE_ENV).all()
      assert (src[at + n_prompt:at + n_prompt + n_answer] == SOURCE_POLICY).all()
      assert (seg[at:at + n_prompt + n_answer] == k).all()
      at += n_prompt + n_answer
  np.testing.assert_array_equal(r.rewards, [0.5] * 2 * G)
  _trainer_matches_sampler(policy, r)


def test_a_text_harness_is_stitched_exactly_where_its_calls_extend(engine, policy):
  """A harness that keeps its history as text: a call is stitched onto the row when its
  re-encoded prompt extends the previous call's prompt + answer, else a new segment (the rule,
  recomputed here from the calls); the trainer's log-probs equal the sampler's either way."""
  result = _run(engine, "t_text", _problems("12*3=", "8*9="))
  r = result.rollout
  for row, calls in enumerate(result.calls):
    assert len(calls) == 3
    seg = 1
    for k in (1, 2):
      before = calls[k - 1].prompt_ids + calls[k - 1].completion_ids
      seg += calls[k].prompt_ids[:len(before)] != before
    assert r.extras["segment"][row].max() == seg
  assert result.counts["agent/split_episodes"] == sum(
      r.extras["segment"][row].max() > 1 for row in range(len(result.calls)))
  _trainer_matches_sampler(policy, r)


def test_faults_fail_their_episode_only_and_are_explained(engine):
  """A harness that crashes, dies, sends a prompt over the context, sends a request the endpoint
  refuses, never calls, or hangs fails its own episode (reward 0, counted, explained); the good
  episodes of the same batch are scored as usual. (Batches of two problems: the module's
  compiled shapes; the hang alone, since it bounds its batch's time.)"""
  ends, counts = {}, []
  for pair in (("crash", "good"), ("long", "many"), ("silent", "die")):
    result = _run(engine, "t_faults", _problems(*[f"{m} 1" for m in pair]))
    ends.update({m: result.episodes[G * i] for i, m in enumerate(pair)})
    counts.append(result.counts)
    assert {f["outcome"] for f in result.failures} == {"error"}
  hang = _run(engine, "t_faults", _problems("hang 1", "good 2"), timeout_s=3.0)
  ends["hang"] = hang.episodes[0]
  assert ends["crash"].end == "error" and "the agent crashed" in ends["crash"].error
  assert ends["long"].end == "error" and "over the 100" in ends["long"].error
  assert ends["many"].end == "error" and "n=2" in ends["many"].error
  assert ends["silent"].end == "error" and "made no call" in ends["silent"].error
  assert ends["die"].end == "error" and "died" in ends["die"].error
  assert ends["hang"].end == "timeout" and "env.timeout_s=3.0" in ends["hang"].error
  assert ends["good"].end == "done" and ends["good"].reward == 1.0
  assert [c["env/errors"] for c in counts] == [G, 2 * G, 2 * G]
  assert counts[1]["agent/refused"] == 2 * G and hang.counts["env/timeouts"] == G
  np.testing.assert_array_equal(hang.rollout.rewards, [0.0] * G + [1.0] * G)

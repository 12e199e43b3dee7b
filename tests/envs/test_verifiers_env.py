"""Environments of the ``verifiers`` library run by rljax (``rljax/envs/verifiers_env.py``).

Scripted policies (no model) write the same turns through rljax's multi-turn driver and through
the library's own ``run_rollout`` (its rollout loop and rubric scoring, with a chat client that
returns the same turns as messages written by hand): the rewards agree, and match the rubric's
weights worked by hand. Then the bad inputs, and ``configs/tasks/verifiers.py`` for two steps."""
import asyncio
import dataclasses
import json
import os
import time

import jax
import numpy as np
import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.config.checks import ConfigError, check_config
from rljax.data import datasets, verifiers_source
from rljax.data.tokenizer import CharTokenizer, load_tokenizer
from rljax.envs import verifiers_demo
from rljax.envs.episodes import SOURCE_ENV, SOURCE_POLICY, EnvSettings, run_episodes
from rljax.errors import DataError
from tests.envs.chat_templates import build_tokenizer
from tests.envs.test_driver import SP, ScriptedPolicy
from tests.train import tiny

import verifiers as vf
from verifiers.types import Response, ResponseMessage, ToolCall

TOK = CharTokenizer()
DEMO = "rljax.envs.verifiers_demo"
ARITH = f"verifiers:{DEMO}:load_arith_environment"
CALC = f"verifiers:{DEMO}:load_calc_environment"
ARGS = json.dumps({"num_examples": 40})
FORMAT_WEIGHT = 0.1  # verifiers_demo's default weight of the integer-answer term


def _problems(source, n, args=ARGS, chat=False):
  return datasets.load_problems(source, split="train", verifiers={"args": args},
                                chat_template=chat)[:n]


def _settings(**kw):
  return EnvSettings(**{"name": "verifiers", "max_turns": 3, "max_tokens": 24, "workers": 2,
                        "timeout_s": 10.0, **kw})


class ScriptedClient(vf.Client):
  """The library's chat client, answering a rollout's model calls with ``replies`` in order."""

  def __init__(self, replies):
    super().__init__(None)
    self.replies = list(replies)

  def setup_client(self, config):
    return None

  async def to_native_tool(self, tool):
    return tool

  async def to_native_prompt(self, messages):
    return messages, {}

  async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
    content, calls = self.replies.pop(0)
    message = ResponseMessage(content=content, tool_calls=calls,
                              finish_reason="tool_calls" if calls else "stop", is_truncated=False)
    return Response(id="scripted", created=0, model=model, message=message)

  async def raise_from_native_response(self, response):
    return None

  async def from_native_response(self, response):
    return response

  async def close(self):
    return None


def library_reward(source, problem, replies, args=ARGS) -> float:
  """The library's own rollout and scoring of ``problem``'s row with these replies."""
  env = verifiers_source.environment(source.split(":", 1)[1], args)
  row = problem.meta["verifiers"]["row"]
  out = asyncio.run(env.run_rollout(row, ScriptedClient(replies), "scripted", {}))
  return float(out["reward"])


def test_single_turn_rewards_are_the_librarys():
  problems = _problems(ARITH, 3)
  turns = lambda p: ["#" + p.answer, "#0" if p.answer != "0" else "#1", "none"]
  script = lambda text, member: turns(next(p for p in problems if p.prompt == text))[member]
  result = run_episodes(problems, jax.random.PRNGKey(0), generate=ScriptedPolicy(script),
                        tokenizer=TOK, settings=_settings(max_turns=1), sampling=SP,
                        group_size=3, prompt_bucket=8)
  rewards = result.rollout.rewards.reshape(3, 3)
  for problem, row in zip(problems, rewards):
    library = [library_reward(ARITH, problem, [(t, None)]) for t in turns(problem)]
    np.testing.assert_allclose(row, library, rtol=1e-6)
    # Right: both terms; a wrong integer: the format term; no integer: nothing.
    np.testing.assert_allclose(row, [1 + FORMAT_WEIGHT, FORMAT_WEIGHT, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(result.rollout.correct.reshape(3, 3), [[True, False, False]] * 3)
  assert result.counts["env/errors"] == 0 and result.counts["env/turns"] == 9


def _calc_turns(problem):
  """Per member: (rljax turn texts, the same turns as the library's messages)."""
  expression, answer = problem.prompt[:-1], problem.answer
  call = ("", [ToolCall(id="c", name="calc", arguments=json.dumps({"expression": expression}))])
  return [
      ([f"<calc {expression}>", f"#{answer}"], [call, (f"#{answer}", None)]),  # tool, right
      (["#0"], [("#0", None)]),  # no tool, wrong
      ([f"<calc {expression}>", "#1"], [call, ("#1", None)]),  # tool, wrong
      ([f"#{answer}"], [(f"#{answer}", None)]),  # no tool, right
  ]


def test_tool_environment_rewards_are_the_librarys_and_results_are_observations():
  problems = _problems(CALC, 2)

  # Members 0 and 2 make the same call; later turns run one row per call, in row order, so the
  # first to continue from the calculator's result is member 0 (it answers right), then member 2.
  seen = {}

  def policy_script(text, member):
    problem = next(p for p in problems if text.startswith(p.prompt))
    if text == problem.prompt:
      return _calc_turns(problem)[member][0][0]
    k = seen.get(text, 0)
    seen[text] = k + 1
    return f"#{problem.answer}" if k == 0 else "#1"

  result = run_episodes(problems, jax.random.PRNGKey(0), generate=ScriptedPolicy(policy_script),
                        tokenizer=TOK, settings=_settings(max_tokens=40), sampling=SP,
                        group_size=4, prompt_bucket=8)
  r = result.rollout
  for i, problem in enumerate(problems):
    for member, (texts, replies) in enumerate(_calc_turns(problem)):
      row = i * 4 + member
      assert result.transcripts[row].startswith(texts[0])
      assert r.rewards[row] == pytest.approx(library_reward(CALC, problem, replies), rel=1e-6)
      calls = texts[0].startswith("<calc")
      assert r.extras["env_turns"][row] == (2 if calls else 1)
      assert r.extras["env_tool_calls"][row] == int(calls)
      source = r.extras["source"][row]
      env_ids = r.tokens[row][source == SOURCE_ENV]
      if calls:  # the calculator's result, bare (compact format), never trained on
        assert TOK.decode(env_ids) == problem.answer
      else:
        assert env_ids.size == 0
      assert not r.mask[row][source == SOURCE_ENV].any()
      assert (r.mask[row] == (source == SOURCE_POLICY)).all()
    # Hand-worked: right answers earn 1 + the format term, wrong integers the format term.
    np.testing.assert_allclose(r.rewards[i * 4:i * 4 + 4],
                               [1 + FORMAT_WEIGHT, FORMAT_WEIGHT, FORMAT_WEIGHT,
                                1 + FORMAT_WEIGHT], rtol=1e-6)
  assert result.counts["env/errors"] == 0


def test_chat_template_and_hermes_calls(tmp_path):
  """With a chat template the episode is the library's conversation in the model's chat format:
  the prompt messages rendered by the template, a hermes call read into the assistant message's
  ``tool_calls``, the tool message rendered by the template as the observation."""
  tok = load_tokenizer(build_tokenizer("qwen2.5", str(tmp_path / "qwen")), chat_template=True)
  problems = _problems(CALC, 1, chat=True)
  problem = problems[0]
  expression, answer = problem.prompt[:-1], problem.answer
  call = ('<tool_call>\n{"name": "calc", "arguments": {"expression": "%s"}}\n'
                   '</tool_call>' % expression)

  def script(text, member):
    return call if "tool_response" not in text else f"#{answer}"

  sp = dataclasses.replace(SP, stop_ids=(tok.eos_id,), pad_id=tok.pad_id, max_new_tokens=48)
  result = run_episodes(problems, jax.random.PRNGKey(0),
                        generate=ScriptedPolicy(script, tokenizer=tok),
                        tokenizer=tok, settings=_settings(max_tokens=160, tool_format="hermes"),
                        sampling=sp, group_size=1, prompt_bucket=8)
  r = result.rollout
  prompt = list(r.prompt_tokens[0][r.prompt_mask[0] > 0])
  assert prompt == tok.encode_prompt([{"role": "user", "content": problem.prompt}])
  source = r.extras["source"][0]
  observed = tok.decode(r.tokens[0][source == SOURCE_ENV], skip_special_tokens=False)
  assert observed == tok.render_followup([{"role": "tool", "content": answer}])
  assert not r.mask[0][source == SOURCE_ENV].any()
  library = library_reward(CALC, problem, [
      ("", [ToolCall(id="c", name="calc", arguments=json.dumps({"expression": expression}))]),
      (f"#{answer}", None)])
  assert r.rewards[0] == pytest.approx(library) == pytest.approx(1 + FORMAT_WEIGHT)
  assert r.extras["env_tool_calls"][0] == 1 and r.extras["env_turns"][0] == 2


def test_rljax_turn_cap_scores_the_rollout_as_the_librarys_own_cap():
  """env.max_turns below the environment's max_turns: the episode is scored at rljax's cap, as
  the library scores a rollout that reaches its own max_turns (the same environment built with
  max_turns=1)."""
  problem = _problems(CALC, 1)[0]
  expression, answer = problem.prompt[:-1], problem.answer
  turn = f"#{answer}<calc {expression}>"  # an answer, then a call the cap leaves unanswered
  result = run_episodes([problem], jax.random.PRNGKey(0),
                        generate=ScriptedPolicy(lambda text, member: turn), tokenizer=TOK,
                        settings=_settings(max_turns=1, max_tokens=40), sampling=SP,
                        group_size=1, prompt_bucket=8)
  capped = json.dumps({"num_examples": 40, "max_turns": 1})
  call = ToolCall(id="c", name="calc", arguments=json.dumps({"expression": expression}))
  library = library_reward(CALC, problem, [(f"#{answer}", [call])], args=capped)
  assert result.rollout.rewards[0] == pytest.approx(library) == pytest.approx(1 + FORMAT_WEIGHT)
  assert result.episodes[0].end == "done" and result.episodes[0].turns == 1


def not_an_environment(**kwargs):
  return {"dataset": []}


def _raises(completion, answer) -> float:
  raise ZeroDivisionError("the reward function failed")


def _hangs(completion) -> float:
  time.sleep(3600)
  return 1.0


def broken_rubric(num_examples: int = 40, hang: bool = False):
  env = verifiers_demo.load_arith_environment(num_examples=num_examples)
  env.rubric.add_reward_func(_hangs if hang else _raises)
  return env


def test_bad_input():
  with pytest.raises(DataError, match="module 'no_such_module' cannot be imported"):
    _problems("verifiers:no_such_module:load", 1)
  with pytest.raises(DataError, match="has no function 'nothing'"):
    _problems(f"verifiers:{DEMO}:nothing", 1)
  with pytest.raises(DataError, match="building the environment failed"):
    _problems("verifiers:no-such-environment", 1)
  with pytest.raises(DataError, match="built a dict, not a verifiers Environment"):
    _problems(f"verifiers:{__name__}:not_an_environment", 1)
  with pytest.raises(DataError, match="not JSON"):
    _problems(ARITH, 1, args="{num_examples: 3}")
  with pytest.raises(DataError, match="building the environment failed .*TypeError"):
    _problems(ARITH, 1, args=json.dumps({"no_such_argument": 1}))
  # A reward function that raises: the library logs it and scores it 0; rljax counts the episode
  # as a failed one (reward 0), like a crashing environment step.
  source = f"verifiers:{__name__}:broken_rubric"
  problems = _problems(source, 2)
  result = run_episodes(problems, jax.random.PRNGKey(0),
                        generate=ScriptedPolicy(lambda text, member: "#1"), tokenizer=TOK,
                        settings=_settings(max_turns=1), sampling=SP, group_size=2,
                        prompt_bucket=8)
  assert result.counts["env/errors"] == 4 and not result.rollout.rewards.any()
  assert all("the rubric failed" in f["detail"] and "_raises" in f["detail"]
             for f in result.failures)
  # A reward function that never returns costs its episode env.timeout_s, not the run.
  hanging = _problems(source, 1, args=json.dumps({"num_examples": 40, "hang": True}))
  start = time.monotonic()
  result = run_episodes(hanging, jax.random.PRNGKey(0),
                        generate=ScriptedPolicy(lambda text, member: "#1"), tokenizer=TOK,
                        settings=_settings(max_turns=1, timeout_s=1.0), sampling=SP,
                        group_size=2, prompt_bucket=8)
  assert result.counts["env/timeouts"] == 2 and not result.rollout.rewards.any()
  assert time.monotonic() - start < 60


def _config(**overrides):
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "tasks", "verifiers.py"),
                                   [(k, str(v)) for k, v in overrides.items()])


def test_keys_go_together():
  check_config(_config())
  with pytest.raises(ConfigError, match="a verifiers environment's dataset"):
    check_config(_config(**{"env.name": "guess"}))
  single = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                     [("data.verifiers.args", '{"a": 1}')])
  with pytest.raises(ConfigError, match="data.verifiers.args=.* is not used"):
    check_config(single)
  with pytest.raises(ConfigError, match="a verifiers environment's dataset"):
    check_config(config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                           [("data.source", ARITH)]))


@pytest.mark.slow
def test_config_trains_two_steps(tmp_path):
  run_dir = str(tmp_path / "run")
  overrides = {k: v for k, v in tiny.OVERRIDES.items()
               if k.startswith("model.") or k in ("train.progress", "train.export_hf")}
  overrides.update({"rollout.prompts_per_step": "2", "rollout.group_size": "4",
                    "data.num_eval": "4", "data.verifiers.args": ARGS, "train.steps": "2",
                    "train.eval_every": "0", "train.run_dir": run_dir})
  args = ["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "verifiers.py")]
  result = cli.main(args + [f"--config.{k}={v}" for k, v in overrides.items()])
  assert 0.0 <= result["eval_before"] <= 1.0 and 0.0 <= result["eval_after"] <= 1.0
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    trained = [m for m in map(json.loads, f) if "loss" in m]
  assert len(trained) == 2
  for m in trained:
    assert m["env/episodes"] == 8 and m["env/errors"] == 0 and m["env/timeouts"] == 0
    # Every reward is one the rubric can give: 0, the format term, or 1 + the format term.
    assert 0.0 <= m["reward_mean"] <= 1 + FORMAT_WEIGHT

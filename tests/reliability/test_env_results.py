"""What an environment returns is checked at one boundary (``rljax.envs.validate``), for both
engines: a bad result costs its trajectory (counted, its text in ``env_failures.jsonl`` and a
one-line summary per batch); an environment that cannot work at all (every episode of the first
batch fails, a class the workers cannot receive) stops the run with one line naming it."""
import json
import os

import jax
import numpy as np
import pytest

from rljax import cli, models
from rljax.config import loader as config_loader
from rljax.data.tasks import Problem
from rljax.data.tokenizer import CharTokenizer
from rljax.envs import ENVS, Environment, StepResult, register_env, unregister_env
from rljax.envs import validate
from rljax.envs.async_turns import run_async_episodes
from rljax.envs.failures import EnvironmentBrokenError, FailureReport
from rljax.envs.episodes import SOURCE_ENV, EnvSettings, run_episodes
from rljax.envs.runner import close_env_pool
from rljax.models import transformer
from rljax.train import build
from tests.envs.test_driver import SP, ScriptedPolicy, tiny_model_config
from tests.train import tiny

TOK = CharTokenizer()  # 57 ids
PROBE = "test_probe_env"
BROKEN = "test_broken_reset"
MB = 10_000_000

if PROBE not in ENVS:
  @register_env(PROBE)  # module level: the worker processes unpickle it by reference
  class Probe(Environment):
    """The problem's prompt names what ``reset`` and the first ``step`` return (``PROBES``)."""

    def reset(self, problem):
      self.case = problem.prompt
      first = PROBES[self.case][0]
      return first if first is not None else "go:"

    def step(self, action):
      return PROBES[self.case][1]

  @register_env(BROKEN)
  class Broken(Environment):
    def reset(self, problem):
      raise ValueError(f"no level {problem.prompt!r}")

    def step(self, action):
      return StepResult("", 0.0, True, {})

PROBES = {  # case -> (first observation or None for 'go:', step result)
    "ok": (None, StepResult("", 1.0, True, {"correct": True})),
    "big reward": (None, StepResult("", 1e300, True, {})),
    "nan reward": (None, StepResult("", float("nan"), True, {})),
    "text reward": (None, StepResult("", "1.0", True, {})),
    "done no": (None, StepResult("x", 0.0, "no", {})),
    "correct no": (None, StepResult("", 1.0, True, {"correct": "no"})),
    "huge count": (None, StepResult("x", 0.0, False, {"tool_calls": 10**30})),
    "id over": (None, StepResult([3, 57], 0.0, False, {})),
    "id negative": (None, StepResult([3, -1], 0.0, False, {})),
    "id 2**40": (None, StepResult([2**40], 0.0, False, {})),
    "none observation": (None, StepResult(None, 0.0, False, {})),
    "empty first": ("", StepResult("", 1.0, True, {})),
    "long first": ("1" * 30, StepResult("", 1.0, True, {})),
    "10 mb first": ("1" * MB, StepResult("", 1.0, True, {})),
    "ids first": ([5, 6, 99], StepResult("", 1.0, True, {})),
    "10 mb step": (None, StepResult("2" * MB, 0.0, False, {})),
    "empty step": (None, StepResult("", 0.0, False, {})),
}


class Counting(CharTokenizer):
  """A char tokenizer that records the longest text it was asked to encode."""
  longest = 0

  def encode(self, text):
    Counting.longest = max(Counting.longest, len(text))
    return super().encode(text)


def _run(cases, tokenizer=TOK, max_turns=2, max_tokens=40, **kw):
  problems = [Problem(case, "0") for case in cases]
  policy = ScriptedPolicy(lambda text, member: "a", tokenizer)
  settings = EnvSettings(name=PROBE, max_turns=max_turns, max_tokens=max_tokens, workers=2,
                         max_prompt_tokens=20, **kw)
  return run_episodes(problems, jax.random.PRNGKey(0), generate=policy, tokenizer=tokenizer,
                      settings=settings, sampling=SP, group_size=1, prompt_bucket=8)


def test_bad_results_cost_their_trajectory_with_the_reason():
  cases = [c for c in PROBES if "10 mb" not in c]
  result = _run(cases)
  why = {c: (ep.end, ep.error) for c, ep in zip(cases, result.episodes)}
  assert why["ok"] == ("done", "")
  assert result.rollout.rewards[cases.index("ok")] == 1.0
  expected = {
      "big reward": "EnvResultError: reward 1e+300 is not finite in float32 (|r| <= 3.4e+38)",
      "nan reward": "EnvResultError: reward nan is not finite in float32 (|r| <= 3.4e+38)",
      "text reward": "EnvResultError: reward must be a number, got str '1.0'",
      "done no": "EnvResultError: done must be a bool, got str 'no'",
      "correct no": "EnvResultError: info['correct'] must be a bool, got str 'no'",
      "huge count": "EnvResultError: info['tool_calls'] must be a count in [0, 1000000], got "
                    "1000000000000000000000000000000",
      "id over": "the observation holds the token id 57, outside the vocabulary [0, 57)",
      "id negative": "the observation holds the token id -1, outside the vocabulary [0, 57)",
      "id 2**40": f"the observation holds the token id {2**40}, outside the vocabulary [0, 57)",
      "none observation": "EnvResultError: observation must be text, token ids or chat messages, "
                          "got NoneType None",
      "empty first": "the first observation is empty (it would be a lone BOS token)",
      "long first": "the first observation has 31 tokens, more than the 20 a prompt may hold "
                    "(the model's context less env.max_tokens, data.max_prompt_tokens)",
      "ids first": "the first observation holds the token id 99, outside the vocabulary [0, 57)",
  }
  for case, text in expected.items():
    assert why[case] == ("error", text), case
  # Every one of them scores 0, counted as an error; nothing of it reached the record's ids.
  failed = [cases.index(c) for c in expected]
  assert (result.rollout.rewards[failed] == 0).all() and not result.rollout.correct[failed].any()
  assert result.counts["env/errors"] == len(expected)
  assert int(result.rollout.tokens.max()) < TOK.vocab_size and result.rollout.tokens.min() >= 0
  assert [f["detail"] for f in result.failures] == [why[c][1] for c in cases if c in expected]


def test_a_10_mb_observation_is_never_encoded_whole():
  Counting.longest = 0
  result = _run(["10 mb first"], tokenizer=Counting())
  (episode,) = result.episodes
  assert episode.end == "error"
  assert episode.error == (f"the first observation has {MB} characters, more than a prompt of "
                           "20 tokens can hold (the model's context less env.max_tokens)")
  assert Counting.longest < 100  # only the failed row's problem prompt was encoded
  # A step's 10 MB observation: at most the room left times MAX_CHARS_PER_TOKEN characters are
  # encoded, and the trajectory is cut at env.max_tokens.
  result = _run(["10 mb step"], tokenizer=Counting())
  (episode,) = result.episodes
  assert (episode.end, episode.truncated, len(episode.ids)) == ("max_tokens", True, 40)
  assert Counting.longest <= 39 * validate.MAX_CHARS_PER_TOKEN


def test_an_empty_step_observation_appends_nothing():
  result = _run(["empty step"], max_turns=3)
  (episode,) = result.episodes
  assert (episode.end, episode.turns) == ("max_turns", 3)
  assert SOURCE_ENV not in episode.source and TOK.decode(episode.ids) == "aaa"


def test_the_worker_side_checks_accept_numpy_values():
  observation, reward, done, info = validate.check_step(StepResult(
      np.array([4, 5]), np.float32(0.5), np.bool_(False),
      {"correct": np.bool_(True), "tool_calls": np.int64(2), "note": {"x": (1, 2)}}))
  assert (observation, reward, done) == ([4, 5], 0.5, False)
  assert info == {"correct": True, "tool_calls": 2, "note": {"x": [1, 2]}}
  assert type(info["correct"]) is bool and type(info["tool_calls"]) is int
  with pytest.raises(validate.EnvResultError, match=r"step returned NoneType None, not a "):
    validate.check_step(None)
  with pytest.raises(validate.EnvResultError, match="info must be a dict, got list"):
    validate.check_step(("", 0.0, True, ["correct"]))
  messages = [{"role": "tool", "content": "1"}]
  assert validate.check_observation(messages) == messages
  with pytest.raises(validate.EnvResultError, match="a chat message needs a str 'role'"):
    validate.check_observation([{"role": "tool", "content": 1}])


class _Result:
  def __init__(self, failures, n):
    self.failures, self.episodes = failures, [None] * n


def test_failures_are_summarised_logged_and_stop_a_broken_environment(tmp_path):
  lines = []
  path = str(tmp_path / "env_failures.jsonl")
  report = FailureReport("probe", path, limit=3, warn=lines.append)
  some = [{"outcome": "error", "detail": "ValueError: bad\nmore", "turn": 1, "transcript": "a"},
          {"outcome": "timeout", "detail": "step took over 5.0 s", "turn": 0, "transcript": ""}]
  report(_Result(some, 4))  # the first batch, not every episode failed: it goes on
  assert lines == ["2 of 4 episodes of environment 'probe' failed (1 error, 1 timeout); first: "
                   "ValueError: bad"]
  report(_Result([], 4))
  report(_Result(some * 2, 4))  # every episode of a later batch: reported, not fatal
  assert len(lines) == 2
  with open(path) as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 3  # the limit over the run
  assert records[0] == dict(some[0], environment="probe")
  broken = FailureReport("probe", None, warn=lines.append)
  with pytest.raises(EnvironmentBrokenError) as info:
    broken(_Result(some[:1] * 2, 2))
  assert str(info.value) == ("environment 'probe': every episode of the first batch failed (2); "
                             "first: ValueError: bad")


TINY = {
    "model.source": "tiny", "model.hidden_size": "32", "model.intermediate_size": "64",
    "model.num_layers": "1", "model.num_heads": "2", "model.num_kv_heads": "1",
    "rollout.prompts_per_step": "2", "rollout.group_size": "2", "rollout.max_new_tokens": "12",
    "env.max_tokens": "40", "data.num_eval": "4", "train.steps": "2", "train.eval_every": "0",
    "train.progress": "false", "train.export_hf": "false", "reward.workers": "1",
}


def _train(tmp_path, env_name):
  run_dir = str(tmp_path / "run")
  args = ["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "guess.py")]
  args += [f"--config.{k}={v}" for k, v in dict(TINY, **{"train.run_dir": run_dir,
                                                          "env.name": env_name}).items()]
  with pytest.raises(SystemExit) as info:
    cli.entry(args)
  return info.value.code, run_dir


@pytest.mark.slow
def test_an_environment_whose_every_reset_fails_stops_the_run_in_one_line(tmp_path, capsys):
  code, run_dir = _train(tmp_path, BROKEN)
  assert code == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: environment {BROKEN!r}: every episode of the first batch failed "
                        "(") and err.endswith("first: ValueError: no level 'guess 1-16:'\n")
  assert err.count("\n") == 1
  with open(os.path.join(run_dir, "env_failures.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert records and all(r["environment"] == BROKEN and r["outcome"] == "error"
                         and r["detail"].startswith("ValueError: no level ") for r in records)
  close_env_pool()


def test_an_environment_the_workers_cannot_receive_is_refused_before_the_model(tmp_path, capsys):
  @register_env("test_local_env")
  class Local(Environment):  # defined in a function (as in a config file): not importable
    def reset(self, problem):
      return problem.prompt

    def step(self, action):
      return StepResult("", 0.0, True, {})
  try:
    code, run_dir = _train(tmp_path, "test_local_env")
  finally:
    unregister_env("test_local_env")
  assert code == 2
  err = capsys.readouterr().err
  assert err.startswith("error: env.name='test_local_env' cannot be sent to its worker processes "
                        "(AttributeError: Can't pickle local object") or err.startswith(
      "error: env.name='test_local_env' cannot be sent to its worker processes (PicklingError")
  assert err.endswith("define the class in an importable module, not in the config file or a "
                      "notebook's __main__\n") and err.count("\n") == 1
  assert not os.path.exists(run_dir)  # refused before the run dir was claimed


@pytest.mark.slow
def test_the_continuous_engine_reads_results_through_the_same_checks():
  cfg = tiny_model_config()
  cases = ["ok", "big reward", "correct no", "id over", "empty first"]
  result = run_async_episodes(
      [Problem(case, "0") for case in cases], jax.random.PRNGKey(0), cfg=cfg,
      params=transformer.init_params(cfg, seed=0), tokenizer=TOK,
      settings=EnvSettings(name=PROBE, max_turns=2, max_tokens=24, workers=2,
                           max_prompt_tokens=20),
      sampling=SP, group_size=1, prompt_bucket=8)
  reference = _run(cases, max_tokens=24)
  assert [(ep.end, ep.error) for ep in result.episodes][1:] == [
      (ep.end, ep.error) for ep in reference.episodes][1:]
  assert result.counts["env/errors"] == reference.counts["env/errors"] == 4


def test_the_run_limits_first_observations_to_the_context_less_the_episode_budget():
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "tasks", "guess.py"),
                                     list(TINY.items()))
  context = models.tiny_config(config.model, TOK.vocab_size, eos_token_id=TOK.eos_id,
                               pad_token_id=TOK.pad_id).max_position_embeddings
  assert build.env_settings(config, TOK).max_prompt_tokens == context - 40  # TINY's env.max_tokens
  config = config_loader.load_config(
      os.path.join(tiny.ROOT, "configs", "tasks", "guess.py"),
      [(k, v) for k, v in TINY.items()] + [("data.max_prompt_tokens", "9")])
  assert build.env_settings(config, TOK).max_prompt_tokens == 9

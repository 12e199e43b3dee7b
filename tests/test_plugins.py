"""Each kind of plug-in costs one module and its test: a data source, a logger, a reward source, an
environment and a rollout engine, each registered in this file (as a notebook cell or a plugin
module would register it), picked by name in the config and run through ``rljax train``; nothing
else is edited. The registrations declare the config keys only they read, and the key check
derives from those declarations which keys another pick leaves unread."""
import hashlib
import json
import os

import numpy as np
import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.config.checks import check_config
from rljax.data import Problem, Rows, register_data_source
from rljax.data import tokenizer as tokenizer_lib
from rljax.envs import Environment, StepResult, register_env
from rljax.errors import UnknownComponentError, UnusedKeyError
from rljax.registries import DATA_SOURCES, ENVS, LOGGERS, REWARD_SOURCES, ROLLOUT_ENGINES
from rljax.rewards.sources import register_reward_source
from rljax.rollout.engines import EngineBase, register_engine
from rljax.rollout.record import Rollout
from rljax.runs.metrics import read_jsonl
from rljax.runs.trackers import register_logger
from tests.train import tiny

# --- the five plug-ins ---------------------------------------------------------------------------

TRAIN = [(f"{a}+{b}=", "3") for a in range(10) for b in range(10)]  # every answer is "3"
HELD_OUT = [("9*9=", "3"), ("8*8=", "3"), ("7*7=", "3"), ("6*6=", "3")]


def tsv_source(path, settings):
  """``data.source='tsv:PATH'``: one ``prompt<TAB>answer`` per line; lines starting with ``?``
  are held out."""
  with open(path, encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
  problem = lambda i, p, a: Problem(prompt=p.lstrip("?"), answer=a,
                                    meta={"source": path, "line": i + 1})
  return Rows([problem(i, p, a) for i, (p, a) in enumerate(rows) if not p.startswith("?")],
              held_out=[problem(i, p, a) for i, (p, a) in enumerate(rows) if p.startswith("?")])


CANNED = ("1", "2", "3", "4")  # completion i of a group; "3" is every problem's answer
PROMPTS, CALLS = [], []  # the prompts each generate call decoded; (rows, slot budget) per call


class CannedEngine(EngineBase):
  """Replays ``CANNED[i % 4]`` then EOS as row i's completion; reads the slot budget
  ``rollout.max_concurrent_rows`` (the key it declares) and records it with each call."""

  def __init__(self, config, model_cfg, placement):
    super().__init__(model_cfg)
    self.tok = tokenizer_lib.load_tokenizer(config.data.tokenizer)
    self.ids = [self.tok.encode(text) + [self.tok.eos_id] for text in CANNED]
    self.slots = config.rollout.max_concurrent_rows

  def generate(self, tokens, mask, key, sampling, group_size):
    PROMPTS.append([self.tok.decode([t for t, m in zip(row, keep) if m])
                    for row, keep in zip(np.asarray(tokens), np.asarray(mask))])
    rows, t = len(tokens) * group_size, sampling.max_new_tokens
    CALLS.append((rows, self.slots))
    out = np.full((rows, t), self.tok.pad_id, np.int32)
    lengths = np.zeros(rows, np.int32)
    for r in range(rows):
      ids = self.ids[r % len(self.ids)][:t]
      out[r, :len(ids)], lengths[r] = ids, len(ids)
    completion_mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    zeros = np.zeros((rows, t), np.float32)
    return Rollout(prompt_tokens=np.repeat(tokens, group_size, 0),
                   prompt_mask=np.repeat(mask, group_size, 0), tokens=out, mask=completion_mask,
                   sampler_logp=zeros, draw_logp=zeros, lengths=lengths,
                   truncated=np.zeros(rows, bool))


def length_source(config, tokenizer, model_cfg, mesh):
  """A completion's length in tokens (EOS included)."""
  return lambda batch: np.asarray(batch.mask).sum(axis=1).astype(np.float32)


RECORDS = []  # (stream, step, metrics, tags) of every call the logger got


class ListLogger:
  def __init__(self, tags):
    self.tags = tags

  def log(self, step, metrics, stream="metrics"):
    RECORDS.append((stream, int(step), dict(metrics), self.tags))

  def log_config(self, config):
    pass

  def log_artifact(self, path):
    pass

  def close(self):
    pass


def listing_logger(config, start):
  """Every record, kept in ``RECORDS``, tagged with ``train.tracker_tags``."""
  return ListLogger(tuple(config.train.tracker_tags))


class Say(Environment):
  """One turn: the policy's answer, 1 when it is the problem's answer."""

  def reset(self, problem):
    self.answer = problem.answer
    return problem.prompt

  def step(self, action):
    right = action.strip() == self.answer
    return StepResult("", float(right), True, {"correct": right})


@pytest.fixture(scope="module", autouse=True)
def registered():
  """The five registrations, as a notebook cell or a plugin module makes them; they last as long
  as this file's tests (other test files list what is registered)."""
  register_data_source("tsv", files=lambda path: [path])(tsv_source)
  register_engine("canned", reads=("rollout.max_concurrent_rows",))(CannedEngine)
  register_reward_source("length")(length_source)
  register_logger("listing", reads=("train.tracker_tags",))(listing_logger)
  register_env("say")(Say)
  yield
  for registry, name in ((DATA_SOURCES, "tsv"), (ROLLOUT_ENGINES, "canned"),
                         (REWARD_SOURCES, "length"), (LOGGERS, "listing"), (ENVS, "say")):
    registry.unregister(name)


# --- the runs ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("data") / "problems.tsv"
  path.write_text("".join(f"{p}\t{a}\n" for p, a in TRAIN)
                  + "".join(f"?{p}\t{a}\n" for p, a in HELD_OUT))
  return str(path)


def _train(run_dir, extra):
  for log in (PROMPTS, CALLS, RECORDS):
    log.clear()
  result = cli.main(tiny.args("grpo", run_dir, {"rollout.engine": "canned", **extra}))
  return result, [list(p) for p in PROMPTS], list(CALLS), list(RECORDS)


@pytest.fixture(scope="module")
def single_turn(tmp_path_factory, data_file):
  """Data source, logger, reward source and engine, named in one run's config."""
  run_dir = str(tmp_path_factory.mktemp("single") / "run")
  return run_dir, *_train(run_dir, {
      "data.source": f"tsv:{data_file}", "train.loggers": "('jsonl', 'listing')",
      "train.tracker_tags": "('plugin',)", "reward.sources": "verifier:1.0,length:0.5",
      "rollout.max_concurrent_rows": "3"})


def test_a_data_source_registered_here_feeds_the_run(single_turn, data_file):
  run_dir, result, prompts, calls, _ = single_turn
  train_prompts, held_prompts = {p for p, _ in TRAIN}, [p for p, _ in HELD_OUT]
  # The greedy evals (4 rows, one completion each) saw the held-out rows, in some order; the two
  # steps' batches (P = 2 prompts) came from the train rows.
  assert sorted(prompts[0]) == sorted(held_prompts) == sorted(prompts[-1])
  assert [len(p) for p in prompts[1:-1]] == [2, 2]
  assert all(p in train_prompts for p in prompts[1] + prompts[2])
  # Its declared file is what a resume checks: sha256 over the file's name, a NUL, its bytes.
  with open(data_file, "rb") as f:
    want = hashlib.sha256(os.path.basename(data_file).encode() + b"\0" + f.read()).hexdigest()
  with open(os.path.join(run_dir, "data.json")) as f:
    assert json.load(f) == {"source": f"tsv:{data_file}", "sha256": want, "files": {}}


def test_an_engine_registered_here_samples_and_its_declared_key_is_its_own(single_turn):
  _, result, _, calls, _ = single_turn
  # Eval before (4 x 1 rows), two steps (2 prompts x G = 4), eval after: all from this engine,
  # which read the slot budget the config gave it.
  assert calls == [(4, 3), (8, 3), (8, 3), (4, 3)]
  assert result["last"]["len_mean"] == pytest.approx(2.0)  # one character and EOS
  assert ROLLOUT_ENGINES.meta("canned")["reads"] == ("rollout.max_concurrent_rows",)
  config = lambda engine: config_loader.load_config(
      tiny.config_path("grpo"),
      [("rollout.engine", engine), ("rollout.max_concurrent_rows", "3")])
  check_config(config("canned"))
  with pytest.raises(UnusedKeyError, match=r"^rollout.max_concurrent_rows=3 is not used: "
                                           r"rollout.engine='all_rows' does not read it; it is "
                                           r"read by rollout engine 'canned', rollout engine "
                                           r"'continuous'$"):
    check_config(config("all_rows"))


def test_a_reward_source_registered_here_is_composed_into_the_reward(single_turn):
  _, result, _, _, _ = single_turn
  last = result["last"]
  # Each completion is 2 tokens long; one of a group's 4 ("3") is right: R = 1/4 + 0.5 * 2.
  assert last["reward/length"] == pytest.approx(2.0)
  assert last["reward/verifier"] == pytest.approx(0.25)
  assert last["reward_mean"] == pytest.approx(0.25 + 0.5 * 2.0)


def test_a_logger_registered_here_gets_every_record(single_turn):
  run_dir, _, _, _, records = single_turn
  written = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  main = [(step, metrics) for stream, step, metrics, _ in records if stream == "metrics"]
  assert [step for step, _ in main] == [r["step"] for r in written] == [0, 1, 2, 2]
  for (step, metrics), row in zip(main, written):
    assert {k: v for k, v in metrics.items() if v == v} == {
        k: v for k, v in row.items() if k != "step" and v is not None}
  assert {tags for *_, tags in records} == {("plugin",)}
  # train.tracker_tags is declared read by this logger (and the trackers): unread without them.
  config = config_loader.load_config(tiny.config_path("grpo"),
                                     [("train.tracker_tags", "('plugin',)")])
  with pytest.raises(UnusedKeyError, match=r"^train.tracker_tags=\('plugin',\) is not used: "
                                           r"train.loggers=\('jsonl', 'tensorboard'\) does not "
                                           r"read it; it is read by logger 'listing', logger "
                                           r"'mlflow', logger 'wandb'$"):
    check_config(config)


def test_an_environment_registered_here_plays_the_episodes(tmp_path, data_file):
  result, prompts, calls, _ = _train(str(tmp_path / "run"), {
      "data.source": f"tsv:{data_file}", "env.name": "say", "reward.fn": "exact_match"})
  # One turn per episode ("3" right, the others wrong), scored by the environment.
  last = result["last"]
  assert last["env/episodes"] == 8 and last["env/turns_per_episode"] == 1
  assert last["reward/env"] == pytest.approx(0.25) == last["reward_mean"]
  assert result["eval_before"] == result["eval_after"] == pytest.approx(0.25)
  assert sorted(prompts[0]) == sorted(p for p, _ in HELD_OUT)


def test_a_name_nothing_registered_is_one_line_listing_what_is():
  config = config_loader.load_config(tiny.config_path("grpo"),
                                     [("data.source", "tvs:x.tsv")])
  with pytest.raises(UnknownComponentError) as info:
    check_config(config)
  message = str(info.value)
  assert "\n" not in message and message.startswith("data.source='tvs:x.tsv' is not allowed")
  assert all(name in message for name in DATA_SOURCES.names())
  assert {"tsv", "embedded", "jsonl"} <= set(DATA_SOURCES.names())
  assert "say" in ENVS and "length" in REWARD_SOURCES and "listing" in LOGGERS

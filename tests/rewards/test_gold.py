"""The RLHF demo's gold scorer (``rljax.rewards.gold``), its reward model's cold start
(``rljax.train.rlhf``) and the rewards-against-KL plot, against hand-worked values."""
import itertools
import json
import os
import threading
import time

import numpy as np
import pytest

import rljax
from rljax.data import tokenizer as tokenizer_lib
from rljax.data.tasks import Problem, make_task
from rljax.errors import StartupError
from rljax.rewards import gold, sources
from rljax.runs import plot
from rljax.train import rlhf

TOK = tokenizer_lib.load_tokenizer("char")


def _hand_gold(text: str, problem: Problem) -> float:
  # Correct when what follows the last '#' is the answer; one char token each, plus EOS.
  return float(text.rpartition("#")[2].strip() == problem.answer) - 0.02 * (len(text) + 1)


def test_pairs_prefer_the_higher_gold_score_of_correct_and_brief():
  problems = list(itertools.islice(make_task("arithmetic", 0).train_stream(0), 20))
  pairs = list(gold.preference_pairs(problems, TOK, 4, seed=0))
  assert len(pairs) == 4 * len(problems)
  by_prompt = {p.prompt: p for p in problems}
  for pair in pairs:
    problem = by_prompt[pair["prompt"]]
    assert _hand_gold(pair["chosen"], problem) > _hand_gold(pair["rejected"], problem), pair
  # Both preferences appear: a brief correct answer beats the worked one, and any correct one
  # beats a wrong one.
  kinds = {(p["chosen"].startswith("#"), p["rejected"].startswith("#")) for p in pairs}
  assert (True, False) in kinds and (False, True) in kinds


def test_the_gold_source_scores_correctness_minus_brevity():
  config = rljax.config()
  score = sources.REWARD_SOURCES.get("gold")(config, TOK, None, None)
  problem = Problem(prompt="2+7*0=", answer="2", meta={"task": "arithmetic", "difficulty": 0})
  completions = ["#2", "7*0=0,2+0=2 #2", "#3"]
  lengths = [3, 16, 3]  # tokens with EOS
  mask = (np.arange(20)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  batch = sources.RewardBatch(prompts=[problem.prompt] * 3, completions=completions,
                              problems=[problem] * 3, prompt_tokens=mask[:, :1],
                              prompt_mask=mask[:, :1], tokens=mask, mask=mask)
  np.testing.assert_allclose(score(batch).values, [1 - 0.06, 1 - 0.32, -0.06], rtol=1e-6)
  config.data.source = "jsonl:x.jsonl"
  with pytest.raises(StartupError, match="'gold' scores embedded tasks only"):
    sources.REWARD_SOURCES.get("gold")(config, TOK, None, None)


def test_write_pairs_writes_the_count_asked_for(tmp_path):
  path = str(tmp_path / "pairs.jsonl")
  assert gold.write_pairs(path, "arithmetic", 0, TOK, num_pairs=10, seed=3) == 10
  lines = [json.loads(line) for line in open(path)]
  assert len(lines) == 10 and set(lines[0]) == {"prompt", "chosen", "rejected"}


def _demo_config(tmp_path, **reward):
  config = rljax.config()
  config.reward.gold.pairs = 8
  config.reward.model.source = f"run:{tmp_path / 'rm'}"
  config.rm.train_file = str(tmp_path / "pairs.jsonl")
  for key, value in reward.items():
    config.reward.model[key] = value
  return config


def test_the_cold_start_reuses_a_trained_reward_model_and_refuses_other_forms(tmp_path):
  config = _demo_config(tmp_path)
  os.makedirs(tmp_path / "rm" / "hf")
  (tmp_path / "rm" / "hf" / "config.json").write_text("{}")
  said = []
  rlhf.prepare_reward_model(config, log=said.append)
  assert said == [f"using the reward model in {tmp_path / 'rm'}"]
  assert not os.path.exists(config.rm.train_file)  # nothing written, nothing trained
  with pytest.raises(StartupError, match="reward.model.source must be 'run:DIR' .where it is"):
    rlhf.prepare_reward_model(_demo_config(tmp_path, source="hf:/some/rm"))
  config = _demo_config(tmp_path / "fresh")
  config.data.source = "jsonl:x.jsonl"
  with pytest.raises(StartupError, match="the gold scorer labels embedded tasks"):
    rlhf.prepare_reward_model(config)


def test_runs_sharing_a_reward_model_train_it_once_the_others_wait_and_reuse_it(
    tmp_path, monkeypatch):
  # Two runs of a sweep start together on one reward model dir: the second waits for the first.
  config = _demo_config(tmp_path)
  trained, said, started = [], [], threading.Barrier(2)

  def train(config, run_dir, log):
    time.sleep(0.3)  # long enough for the other thread to reach the lock meanwhile
    os.makedirs(os.path.join(run_dir, "hf"), exist_ok=True)
    (tmp_path / "rm" / "hf" / "config.json").write_text("{}")
    trained.append(run_dir)

  monkeypatch.setattr(rlhf, "_make_reward_model", train)

  def run():
    started.wait()
    rlhf.prepare_reward_model(config, log=said.append)

  threads = [threading.Thread(target=run) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert trained == [str(tmp_path / "rm")]
  assert said == [f"using the reward model in {tmp_path / 'rm'}"]


def test_rewards_against_kl_pair_the_steps_that_logged_both(tmp_path):
  records = [{"step": 1, "kl": 0.0, "reward/rm": 0.1, "reward/gold": 0.5},
             {"step": 2, "kl": 0.2, "reward/rm": 0.4},
             {"step": 3, "kl": 0.5, "reward/rm": 0.9, "reward/gold": 0.3},
             {"step": 3, "eval_accuracy": 0.5}]
  assert plot.against(records, "kl", "reward/gold") == ([0.0, 0.5], [0.5, 0.3])
  assert plot.against(records, "kl", "reward/rm") == ([0.0, 0.2, 0.5], [0.1, 0.4, 0.9])
  path = tmp_path / "metrics.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
  png = str(tmp_path / "out.png")
  assert plot.plot_rewards_vs_kl({"run": str(path)}, png, ["reward/rm", "reward/gold",
                                                           "reward/none"]) == ["reward/rm",
                                                                               "reward/gold"]
  assert os.path.getsize(png) > 0
  # The trend: sorted by KL, windows of max(1, 9 // 8) = 1 point, then of 2 for 16 points.
  assert plot.kl_trend([0.3, 0.1, 0.2], [3.0, 1.0, 2.0]) == ([0.1, 0.2, 0.3], [1.0, 2.0, 3.0])
  x, y = plot.kl_trend(list(range(16))[::-1], list(range(16))[::-1])
  assert x == y == [j + 0.5 for j in range(15)]

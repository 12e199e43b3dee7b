"""data.source='reasoning_gym:...': prompts, the held-out split, the task's own scorer through the
isolated verifier workers, start-up errors, and a 2-step run of configs/tasks/reasoning_gym.py."""
import json
import os

import numpy as np
import pytest
import reasoning_gym

from rljax import cli
from rljax.config import loader as config_loader
from rljax.config.checks import ConfigError, check_config
from rljax.data import datasets, is_eval_prompt, tasks
from rljax.errors import DataError, UnusedKeyError
from rljax.rewards import score_completions
from tests.train import tiny

CONFIG = os.path.join(tiny.ROOT, "configs", "tasks", "reasoning_gym.py")
MIXED = {"weights": "chain_sum=3,basic_arithmetic=1",
         "config": json.dumps({"basic_arithmetic": {"min_terms": 2, "max_terms": 2,
                                                    "min_digits": 1, "max_digits": 1}}),
         "template": "{question}"}


def _config(**overrides):
  return config_loader.load_config(CONFIG, list(overrides.items()))


def _library_entry(problem):
  """The item as reasoning-gym itself generates it (its own dataset object, its own index)."""
  record = problem.meta["reasoning_gym"]
  dataset = reasoning_gym.create_dataset(record["task"], **{"seed": 0, **record["settings"]})
  return dataset, dataset[record["entry"]["metadata"]["source_index"]]


def test_scorer_agrees_with_the_library_on_every_eval_item():
  config = _config()
  source = datasets.make_prompt_source(config.data)
  mixed = datasets.PromptSource("reasoning_gym:chain_sum,basic_arithmetic", reasoning_gym=MIXED)
  configured = source.eval_set(config.data.num_eval)
  problems = configured + mixed.eval_set(32)
  rows, expected = [], []
  for i, problem in enumerate(problems):
    dataset, entry = _library_entry(problem)
    answer = entry["answer"]
    # the config's template is the bare expression, the mixed source's the library's question
    template_text = entry["metadata"]["expression"] + "=" if i < len(configured) else None
    assert problem.prompt == (template_text or entry["question"])
    assert problem.answer == answer
    # right, wrong, the answer with extra text (partial credit by containment), reasoning-gym's
    # <answer> tags (the last one counts), and no answer at all
    for completion, extracted in ((f"#{answer}", answer), (f"#{answer}1", f"{answer}1"),
                                  (f"#x{answer}", f"x{answer}"),
                                  (f"<answer>0</answer> <answer>{answer}</answer>", answer),
                                  ("no answer", None)):
      rows.append((completion, problem))
      expected.append(dataset.score_answer(extracted, entry))
  completions, row_problems = zip(*rows)
  scores = score_completions("reasoning_gym", list(completions), list(row_problems), workers=2)
  expected = np.asarray(expected)
  assert scores.num_errors == scores.num_invalid == scores.num_timeouts == 0
  np.testing.assert_allclose(scores.rewards, expected.astype(np.float32), rtol=0, atol=0)
  np.testing.assert_array_equal(scores.correct, expected >= 1.0)
  assert scores.correct.sum() == 2 * len(problems)  # '#answer' and the tagged one
  assert 0 < expected[(expected > 0) & (expected < 1)].size  # the partial-credit branch ran


def test_prompts_are_a_function_of_the_seeds_and_eval_is_held_out():
  data = _config().data
  a, b = datasets.make_prompt_source(data), datasets.make_prompt_source(data)
  assert a.next_batch(64) == b.next_batch(64)
  assert a.eval_set(64) == b.eval_set(64)
  other_train = datasets.make_prompt_source(_config(**{"data.train_seed": "7"}).data)
  other_eval = datasets.make_prompt_source(_config(**{"data.eval_seed": "7"}).data)
  assert [p.prompt for p in other_train.next_batch(64)] != [p.prompt for p in b.next_batch(64)]
  assert {p.prompt for p in other_eval.eval_set(64)} != {p.prompt for p in a.eval_set(64)}
  held_out = {p.prompt for p in a.eval_set(data.num_eval)}
  assert len(held_out) == data.num_eval and all(is_eval_prompt(p) for p in held_out)
  for stream in (a, other_train):
    assert not held_out & {p.prompt for p in stream.next_batch(2000)}
  # a resumed source continues the same stream
  resumed = datasets.make_prompt_source(data)
  resumed.load_state_dict(a.state_dict())
  assert resumed.next_batch(8) == a.next_batch(8)


def test_weights_set_how_often_each_task_is_drawn():
  drawn = datasets.PromptSource("reasoning_gym:chain_sum,basic_arithmetic", reasoning_gym=MIXED)
  tasks = [p.meta["reasoning_gym"]["task"] for p in drawn.next_batch(2000)]
  # 3:1 -> 0.75; the binomial standard deviation at n=2000 is 0.0097, so 0.05 is 5 sigma
  assert abs(tasks.count("chain_sum") / len(tasks) - 0.75) < 0.05


@pytest.mark.parametrize("source, gym, message", [
    ("reasoning_gym:chain_summ", {}, r"no reasoning-gym task 'chain_summ' \(did you mean "
     r"chain_sum.*reasoning_gym\.factory\.DATASETS"),
    ("reasoning_gym:chain_sum,", {}, "distinct tasks separated by commas"),
    ("reasoning_gym:composite", {}, "list the tasks instead"),
    ("reasoning_gym:chain_sum", {"weights": "chain_sum=-1"}, "positive weight"),
    ("reasoning_gym:chain_sum", {"weights": "gcd=1"}, "'gcd', which is not a task of"),
    ("reasoning_gym:chain_sum", {"config": "{chain_sum: 1}"}, "is not JSON"),
    ("reasoning_gym:chain_sum", {"config": '{"chain_sum": {"min_term": 2}}'},
     "refused by reasoning-gym .*min_term"),
    ("reasoning_gym:chain_sum", {"template": "{expresion}="}, r"fields: \[.*'expression'"),
])
def test_bad_settings_are_one_line_errors(source, gym, message):
  with pytest.raises(DataError, match=message) as error:
    datasets.PromptSource(source, reasoning_gym=gym)
  assert "\n" not in str(error.value)


def test_an_eval_set_larger_than_the_held_out_part_names_the_size(monkeypatch):
  # chain_sum at the library's size (500 items): at most ~50 distinct held-out prompts; fewer
  # fruitless draws before giving up keep the test short (all 500 items are seen long before)
  monkeypatch.setattr(tasks, "_EVAL_PATIENCE", 5000)
  with pytest.raises(DataError, match=r"data.num_eval=256: .*sizes \{'chain_sum': 500\}: set "
                     r"a larger 'size'") as error:
    datasets.PromptSource("reasoning_gym:chain_sum", reasoning_gym={}).eval_set(256)
  assert "\n" not in str(error.value)


def test_keys_the_source_does_not_read_are_refused():
  with pytest.raises(UnusedKeyError, match=r"data.reasoning_gym.config='\{.*' is not used"):
    check_config(_config(**{"data.source": "embedded:arithmetic"}))
  with pytest.raises(UnusedKeyError, match="data.difficulty=0 is not used"):
    check_config(_config(**{"data.difficulty": "0"}))


def test_the_reasoning_gym_reward_needs_its_source():
  config = _config(**{"data.source": "embedded:arithmetic", "data.reasoning_gym.config": "{}",
                      "data.reasoning_gym.template": "{question}"})
  with pytest.raises(ConfigError, match=r"reward.fn='reasoning_gym' scores problems of "
                     r"data.source='reasoning_gym:NAME' only.*'embedded:arithmetic'"):
    check_config(config)
  check_config(_config())


def test_train_two_steps_in_process(tmp_path):
  overrides = {k: v for k, v in tiny.OVERRIDES.items()
               if k not in ("data.difficulty", "reward.fn", "data.prompt_bucket")}
  overrides.update({"algo.max_gen_batches": "2", "sft.steps": "2", "sft.batch_size": "8",
                    "sft.warmup_steps": "1", "sft.out_dir": str(tmp_path / "sft"), "train.run_dir": str(tmp_path / "run")})
  result = cli.main(["train", "--config", CONFIG]
                    + [f"--config.{k}={v}" for k, v in overrides.items()])
  assert set(result) >= {"eval_before", "eval_after"}
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    steps = [json.loads(line) for line in f if '"reward/errors"' in line]
  assert len(steps) == 2
  # every completion went through the task's scorer in the verifier workers without a failure
  assert all(s["reward/errors"] == s["reward/invalid"] == s["reward/timeouts"] == 0 for s in steps)
  assert not os.path.exists(tmp_path / "run" / "reward_failures.jsonl")

"""Selective rollouts (GRESO): the skip rule and its controller against hand-worked values, the
history a source keeps, its resume state, and a run that skips and resumes exactly."""
import json
import math
import os

import numpy as np
import pytest

from rljax import cli
from rljax.config import checks as config_checks
from rljax.config.loader import load_config
from rljax.data import datasets
from rljax.data.tasks import is_eval_prompt
from rljax.errors import ConfigError
from rljax.rewards import checkers
from rljax.train import loop
from rljax.runs import metrics as metrics_lib
from rljax.train import selective
from tests.train import tiny

G = 4


def _source(explore=0.5, target=0.25):
  return selective.SelectiveSource(datasets.PromptSource("embedded:arithmetic", difficulty=0),
                                   group_size=G, target=target, explore=explore)


def _groups(*pass_counts):
  """[P * G] correct flags: group i has ``pass_counts[i]`` correct completions."""
  return np.concatenate([np.arange(G) < k for k in pass_counts])


def test_skip_probability_is_one_minus_p_to_the_run_floored_at_one_percent_kept():
  assert selective.skip_probability(0.5, 0) == 0.0
  assert selective.skip_probability(0.5, 1) == pytest.approx(0.5)
  assert selective.skip_probability(0.5, 3) == pytest.approx(0.875)
  assert selective.skip_probability(0.2, 2) == pytest.approx(0.96)
  # 0.5 ** 10 = 0.00098 < 0.01: a prompt is always kept with probability 0.01 at least.
  assert selective.skip_probability(0.5, 10) == pytest.approx(0.99)


def test_exploration_steps_by_one_percent_toward_the_target_inside_its_range():
  assert selective.adapt_exploration(0.5, share=0.3, target=0.25) == pytest.approx(0.49)
  assert selective.adapt_exploration(0.5, share=0.25, target=0.25) == pytest.approx(0.49)
  assert selective.adapt_exploration(0.5, share=0.1, target=0.25) == pytest.approx(0.51)
  assert selective.adapt_exploration(0.055, share=0.9, target=0.25) == pytest.approx(0.05)
  assert selective.adapt_exploration(0.95, share=0.0, target=0.25) == pytest.approx(0.95)


def test_groups_are_easy_hard_or_informative_by_their_pass_rate():
  assert selective.zero_spread_kinds(_groups(4, 0, 2, 1), G) == ["easy", "hard", None, None]


def test_history_counts_runs_of_one_kind_and_a_spread_ends_them():
  source = _source()
  problems = source.next_batch(3)
  a, b, c = (p.prompt for p in problems)
  source.observe(problems, _groups(4, 0, 0))
  source.observe(problems, _groups(4, 0, 2))
  assert source.history == {a: ("easy", 2), b: ("hard", 2)}
  source.observe(problems, _groups(0, 4, 0))  # a kind change starts a new run
  assert source.history == {a: ("hard", 1), b: ("easy", 1), c: ("hard", 1)}
  source.observe(problems, _groups(3, 1, 4))
  assert source.history == {c: ("easy", 1)}


def _all_seen(source, prompts, kind, run_length):
  source.history = {p: (kind, run_length) for p in prompts}


@pytest.mark.parametrize("run_length,explore", [(1, 0.5), (2, 0.5), (1, 0.2)])
def test_drawn_prompts_are_skipped_at_the_rule_s_rate(run_length, explore):
  # Every prompt of the first 4000 positions has the same history: the share skipped is a
  # binomial draw around the rule's probability (4 standard deviations: fixed seeds, so the
  # draw is the same on every machine).
  plain = datasets.PromptSource("embedded:arithmetic", difficulty=0)
  source = _source(explore=explore)
  _all_seen(source, {p.prompt for p in plain.next_batch(4000)}, "hard", run_length)
  kept = len(source.next_batch(400))
  drawn = source.position
  expected = selective.skip_probability(explore, run_length)
  assert drawn <= 4000
  sd = math.sqrt(expected * (1 - expected) / drawn)
  assert abs((drawn - kept) / drawn - expected) < 4 * sd
  metrics = source.end_step()
  assert metrics["selective/skipped_prompts"] == drawn - kept


def test_prompts_without_a_run_are_never_skipped():
  source = _source()
  source.history = {"not a prompt of this task": ("hard", 9)}
  source.next_batch(50)
  assert source.position == 50 and source.end_step()["selective/skipped_prompts"] == 0


def test_end_step_moves_each_kind_toward_its_share_of_the_target():
  source = _source(target=0.3)  # easy target 0.1, hard target 0.2
  problems = source.next_batch(10)
  # 10 groups: 1 all correct (0.1 >= 0.1: skip more easy ones), 1 all wrong (0.1 < 0.2).
  source.observe(problems, _groups(4, 0, 1, 2, 3, 1, 2, 3, 1, 2))
  metrics = source.end_step()
  assert metrics["selective/easy_frac"] == pytest.approx(0.1)
  assert metrics["selective/hard_frac"] == pytest.approx(0.1)
  assert metrics["selective/p_easy"] == pytest.approx(0.49)
  assert metrics["selective/p_hard"] == pytest.approx(0.51)


def _drive(source, steps, seed):
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    problems = source.next_batch(16)
    source.observe(problems, rng.integers(0, 2, (16, G)).astype(bool) |
                   (rng.random((16, 1)) < 0.6))  # many all-correct groups
    source.end_step()


def test_state_round_trips_through_json_and_resumes_the_same_draws():
  plain = datasets.PromptSource("embedded:arithmetic", difficulty=0)
  repeated = [p.prompt for p in plain.next_batch(64)]
  source = _source(explore=0.3)
  _all_seen(source, repeated, "easy", 1)
  _drive(source, 5, seed=0)
  state = json.loads(json.dumps(source.state_dict()))
  assert source.history and source.explore != {"easy": 0.3, "hard": 0.3}
  resumed = _source()
  resumed.load_state_dict(state)
  assert resumed.history == source.history and resumed.explore == source.explore
  ahead = [p.prompt for p in source.next_batch(40)]
  assert [p.prompt for p in resumed.next_batch(40)] == ahead
  assert resumed.end_step() == source.end_step()


def test_a_state_saved_without_selective_rollouts_starts_an_empty_history():
  plain = datasets.PromptSource("embedded:arithmetic", difficulty=0)
  plain.next_batch(7)
  source = _source()
  source.history = {"x": ("hard", 2)}
  source.load_state_dict(plain.state_dict())
  assert source.position == 7 and source.history == {}
  plain.load_state_dict(source.state_dict())  # the plain source reads its own keys only
  assert plain.position == 7


def test_selective_rollouts_need_groups_and_their_keys_need_them_on():
  with pytest.raises(ConfigError, match="selective_rollout=True with rollout.group_size=1") as err:
    config_checks.check_config(_config("remax", {"algo.selective_rollout": True}))
  assert "\n" not in str(err.value)
  with pytest.raises(ConfigError, match="algo.skip_target"):
    config_checks.check_config(_config("grpo", {"algo.skip_target": 0.5}))


def _config(preset, values):
  return load_config(os.path.join(tiny.ROOT, "configs", "algos", f"{preset}.py"),
                     [(key, str(value)) for key, value in values.items()])


# --- a run ----------------------------------------------------------------------------------

PARITY = "test_prompt_parity"
if PARITY not in checkers.REWARD_FNS:
  # Correct for every completion of a prompt with an even character sum, for none of the others:
  # each prompt's groups are all easy or all hard whatever the policy samples, so which prompts
  # are skipped does not depend on the model's floats.
  @checkers.register_reward(PARITY)
  def _prompt_parity(completion, problem):
    return float(sum(map(ord, problem.prompt)) % 2 == 0)


def _problems_file(path, train=6, held_out=2):
  rows, n = {True: [], False: []}, 0
  while len(rows[False]) < train or len(rows[True]) < held_out:
    prompt = f"{n}+{n % 7}="
    rows[is_eval_prompt(prompt)].append({"prompt": prompt, "answer": str(n + n % 7)})
    n += 1
  with open(path, "w") as f:
    for row in rows[False][:train] + rows[True][:held_out]:
      f.write(json.dumps(row) + "\n")
  return f"jsonl:{path}"


class Killed(Exception):
  pass


@pytest.mark.slow
def test_a_run_skips_prompts_by_history_and_resumes_with_it(tmp_path, monkeypatch):
  extra = {"data.source": _problems_file(tmp_path / "six.jsonl"), "data.num_eval": "2",
           "reward.fn": PARITY, "algo.selective_rollout": "true", "train.steps": "6",
           # The floor: a prompt seen once is skipped with probability 0.95, so the steps after
           # the first epoch of six prompts (from step 3 on) skip some whatever the hash draws.
           "algo.skip_explore": "0.05",
           "train.checkpoint_every": "2", "algo.minibatches": "2"}
  args = lambda run_dir, more={}: [a for a in tiny.args("grpo", run_dir, {**extra, **more})
                                   if not a.startswith("--config.data.difficulty")]
  full_dir, killed_dir = str(tmp_path / "full"), str(tmp_path / "killed")
  cli.main(args(full_dir))
  steps = [r for r in metrics_lib.read_jsonl(os.path.join(full_dir, "metrics.jsonl"))
           if "selective/skipped_prompts" in r]
  skipped = [r["selective/skipped_prompts"] for r in steps]
  assert len(steps) == 6 and skipped[0] == 0  # no history before the first round
  assert skipped[3] > 0  # after the resume point below: the history must have come back
  assert all(r["selective/easy_frac"] + r["selective/hard_frac"] == pytest.approx(1)
             for r in steps)

  real_collect = loop.collect_batch

  def collect_then_die(run, step, stream=0, **kwargs):
    if step == 3:  # after the step-2 checkpoint
      raise Killed()
    return real_collect(run, step, stream, **kwargs)

  monkeypatch.setattr(loop, "collect_batch", collect_then_die)
  with pytest.raises(Killed):
    cli.main(args(killed_dir))
  monkeypatch.setattr(loop, "collect_batch", real_collect)
  cli.main(args(killed_dir, {"train.resume": "true"}))
  full, resumed = (
      [metrics_lib.without_timing(r) for r in metrics_lib.read_jsonl(os.path.join(d, "metrics.jsonl"))]
      for d in (full_dir, killed_dir))
  assert [r["step"] for r in resumed] == [r["step"] for r in full]
  for a, b in zip(full, resumed):
    assert a.keys() == b.keys()
    for key in a:
      assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), (a["step"], key)

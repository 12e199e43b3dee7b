"""Reward functions, the format term and time-limited batched scoring."""
import time

import numpy as np
import pytest

from rljax.data import Problem, make_task
from rljax.rewards import (REWARD_FNS, exact_match, final_answer, format_ok, get_reward_fn,
                           math_verify_reward, score_completions)
from rljax.rewards.isolation import run_isolated


def test_registry_lists_names_on_error():
  assert {"exact_match", "math_verify"} <= set(REWARD_FNS.names())
  assert get_reward_fn("exact_match") is exact_match
  with pytest.raises(ValueError, match="exact_match"):
    get_reward_fn("exact")


def test_final_answer_extraction():
  assert final_answer("so \\boxed{\\frac{1}{2}} then \\boxed{3}") == "3"
  assert final_answer("x \\boxed{\\frac{a}{b}}.") == "\\frac{a}{b}"
  assert final_answer("work\n#### 72") == "72"
  assert final_answer("1+2=3 #3") == "3"
  assert final_answer("no answer") is None
  assert final_answer("\\boxed{unclosed") is None


def test_exact_match_uses_the_task_verifier_for_embedded_problems():
  problem = make_task("countdown", 1).eval_set(0, 1)[0]
  assert exact_match(problem.solution, problem) == 1.0
  assert exact_match("#" + problem.answer, problem) == 0.0  # countdown needs the steps


def test_exact_match_on_dataset_problems_compares_normalised_text():
  problem = Problem("q", "1,000")
  assert exact_match("so #### 1000", problem) == 1.0
  assert exact_match("\\boxed{1000}", problem) == 1.0
  assert exact_match("#1001", problem) == 0.0
  assert exact_match("1000", problem) == 0.0  # no final-answer marker


@pytest.mark.parametrize("gold,completion", [
    ("\\frac{1}{2}", "the answer is #0.5"),
    ("0.5", "so \\boxed{\\frac{1}{2}}"),
    ("$\\frac{1}{2}$", "\\boxed{0.5}"),
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "48+24=72\n#### 72"),
    ("72", "#### 72"),
    ("\\sqrt{2}", "\\boxed{\\sqrt 2}"),
    ("x+1", "\\boxed{1+x}"),
])
def test_math_verify_equivalences(gold, completion):
  assert math_verify_reward(completion, Problem("q", gold)) == 1.0


@pytest.mark.parametrize("gold,completion", [
    ("\\frac{1}{2}", "#0.6"), ("72", "#### 73"), ("72", "\\boxed{27}"), ("72", ""),
])
def test_math_verify_rejects_wrong_answers(gold, completion):
  assert math_verify_reward(completion, Problem("q", gold)) == 0.0


def test_format_term():
  problem = make_task("arithmetic", 1).eval_set(0, 1)[0]
  assert format_ok(problem.solution, problem)
  assert format_ok("1*1=1,1+1=2 #5", problem)  # well formed, wrong
  assert not format_ok("#" + problem.answer, problem)
  assert format_ok("blah \\boxed{3}", Problem("q", "3"))
  assert not format_ok("blah 3", Problem("q", "3"))


def test_score_completions_rewards_format_and_wrong_value():
  task = make_task("arithmetic", 1)
  problems = task.eval_set(0, 3)
  completions = [problems[0].solution, "1*1=1,1+1=2 #99999", "garbage"]
  scores = score_completions("exact_match", completions, problems, wrong_value=-1.0,
                             format_weight=0.1, timeout_s=5.0, workers=2)
  rewards, correct = scores
  assert rewards.dtype == np.float32 and correct.dtype == bool
  np.testing.assert_allclose(rewards, [1.1, -0.9, -1.0], rtol=1e-6)
  assert correct.tolist() == [True, False, False]
  assert scores.formatted.tolist() == [True, True, False]
  assert (scores.num_timeouts, scores.num_errors) == (0, 0)


def test_score_completions_cuts_off_slow_and_failing_verifiers():
  def verifier(completion, problem):
    if completion == "sleep":
      time.sleep(120)
    if completion == "raise":
      raise RuntimeError("verifier bug")
    return 1.0

  problems = [Problem("q", "1")] * 6
  completions = ["sleep", "ok", "raise", "sleep", "ok", "ok"]
  start = time.monotonic()
  scores = score_completions(verifier, completions, problems, wrong_value=-1.0,
                             timeout_s=0.3, workers=2)
  # Cut off, not waited out: uncut, the two sleeps would take 120 s (measured ~0.4 s cut off;
  # the bound leaves room for a loaded CI machine, where 3 s once failed at 3.2 s).
  assert time.monotonic() - start < 30.0
  assert scores.rewards.tolist() == [-1.0, 1.0, -1.0, -1.0, 1.0, 1.0]
  assert (scores.num_timeouts, scores.num_errors) == (2, 1)


def _square(i):
  return i * i


def test_run_isolated_keeps_order_and_handles_empty_batches():
  outcomes = run_isolated(_square, [(i,) for i in range(20)], timeout_s=5.0, workers=3)
  assert [o.value for o in outcomes] == [i * i for i in range(20)]
  assert run_isolated(_square, [], timeout_s=1.0, workers=3) == []
  assert score_completions("exact_match", [], []).rewards.shape == (0,)


def test_score_completions_checks_lengths():
  with pytest.raises(ValueError, match="2 completions but 1 problems"):
    score_completions("exact_match", ["a", "b"], [Problem("q", "1")])

"""Embedded tasks: determinism, disjoint splits, verifiers on reference and perturbed answers."""
import itertools

import pytest

from rljax.data import TASKS, Problem, is_eval_prompt, make_task

LEVELS = [(name, level) for name, cls in TASKS.items() for level in cls.levels]
MARKED = [(name, level) for name, level in LEVELS if TASKS[name].marked_answer]


@pytest.mark.parametrize("name,level", LEVELS)
def test_problems_are_deterministic_per_seed(name, level):
  task = make_task(name, level)
  first = list(itertools.islice(task.train_stream(seed=3), 20))
  assert first == list(itertools.islice(task.train_stream(seed=3), 20))
  assert first != list(itertools.islice(task.train_stream(seed=4), 20))
  assert list(itertools.islice(task.train_stream(seed=3, start=7), 5)) == first[7:12]
  assert task.eval_set(seed=1, n=10) == task.eval_set(seed=1, n=10)


@pytest.mark.parametrize("name,level", [(n, lv) for n, lv in LEVELS if TASKS[n].split_by_prompt])
def test_train_stream_never_yields_an_eval_prompt(name, level):
  task = make_task(name, level)
  eval_prompts = {p.prompt for p in task.eval_set(seed=1, n=64)}
  train_prompts = {p.prompt for p in itertools.islice(task.train_stream(seed=0), 3000)}
  assert all(is_eval_prompt(p) for p in eval_prompts)
  assert not eval_prompts & train_prompts
  assert not any(is_eval_prompt(p) for p in train_prompts)


def test_eval_set_is_distinct_and_errors_when_the_level_is_too_small():
  task = make_task("arithmetic", 1)
  problems = task.eval_set(seed=1, n=256)
  assert len({p.prompt for p in problems}) == 256
  with pytest.raises(ValueError, match="num_eval=2000"):  # level 0 holds about 900
    make_task("arithmetic", 0).eval_set(seed=1, n=2000)


@pytest.mark.parametrize("name,level", MARKED)
def test_reference_solution_verifies_and_has_the_format(name, level):
  task = make_task(name, level)
  for p in itertools.islice(task.train_stream(seed=0), 200):
    assert p.solution.endswith(" #" + p.answer)
    assert task.verify(p.solution, p) == 1.0, p
    assert task.format_ok(p.solution), p
    assert p.meta == {**p.meta, "task": name, "difficulty": level}


@pytest.mark.parametrize("name", sorted(n for n in TASKS if TASKS[n].marked_answer))
def test_perturbed_answers_are_wrong(name):
  task = make_task(name, min(2, max(TASKS[name].levels)))
  for p in itertools.islice(task.train_stream(seed=0), 100):
    steps, _ = p.solution.rsplit("#", 1)
    wrong = str(int(p.answer) + 1)
    assert task.verify(f"{steps}#{wrong}", p) == 0.0
    assert task.verify(steps, p) == 0.0  # no marker, no answer
    assert task.verify(p.solution[:-1], p) == 0.0  # answer cut by the token budget


def test_arithmetic_examples_and_parsing():
  task = make_task("arithmetic", 1)
  p = Problem("7+3*4=", "19", "3*4=12,7+12=19 #19", {"task": "arithmetic", "difficulty": 1})
  assert task.verify("3*4=12,7+12=19 #19", p) == 1.0
  assert task.verify("#19", p) == 1.0  # outcome reward: the chain is not graded
  assert task.verify("3*4=12,7+12=19 #19 \n", p) == 1.0
  assert task.verify("3*4=12 #19 #18", p) == 0.0  # the last marker counts
  assert task.verify("3*4=12,7+12=19 #19,5", p) == 0.0  # trailing text after the answer
  assert task.verify("3*4=12,7+12=1", p) == 0.0  # cut at max tokens
  assert not task.format_ok("#19")


def test_arithmetic_follows_precedence_and_parentheses():
  task = make_task("arithmetic", 3)
  for p in itertools.islice(task.train_stream(seed=0), 300):
    assert int(p.answer) == eval(p.prompt[:-1])  # the prompt is a Python expression


def test_countdown_verifier_replays_the_steps():
  task = make_task("countdown", 1)
  p = Problem("3 5 7>22:", "22", "5*3=15,15+7=22 #22", {"task": "countdown", "difficulty": 1})
  assert task.verify("5*3=15,15+7=22 #22", p) == 1.0
  assert task.verify("3*5=15,7+15=22 #22", p) == 1.0  # any order, any valid route
  assert task.verify("5*3=15,15+7=22 #21", p) == 0.0  # wrong final answer
  assert task.verify("#22", p) == 0.0  # no steps
  assert task.verify("5*4=20,20+2=22 #22", p) == 0.0  # numbers not given
  assert task.verify("5*3=15,15+7=22,22*1=22 #22", p) == 0.0
  assert task.verify("5*3=15,15+7=22,3+3=6 #22", p) == 0.0  # a number used twice
  assert task.verify("5*3=15 #15", Problem("3 5 7>15:", "15")) == 0.0  # 7 unused
  assert task.verify("5*3=16,16+7=23 #23", Problem("3 5 7>23:", "23")) == 0.0  # bad arithmetic
  assert task.verify("7/5=1,3*1=3,5+3=8 #8", p) == 0.0  # inexact division
  assert task.parse_prompt("3 5 7>22:") == ([3, 5, 7], 22)


def test_unknown_task_and_level_errors_list_the_choices():
  with pytest.raises(ValueError, match="arithmetic"):
    make_task("sudoku", 1)
  with pytest.raises(ValueError, match=r"allowed: \[0, 1"):
    make_task("arithmetic", 99)

"""The embedded environments' step logic against hand-worked episodes, their tasks'
determinism, and their SFT demonstrations replayed through the environments."""
import pytest

from rljax.data.tasks import make_task
from rljax.data.tokenizer import CharTokenizer
from rljax.envs import StepResult, env_names, make_env, register_env, unregister_env
from rljax.config.table import KEY_BY_NAME
from rljax.envs.base import Environment
from rljax.errors import UnknownNameError
from rljax.train import sft


def _problem(task, answer):
  """A problem of ``task`` (level 0) whose answer is ``answer``."""
  t = make_task(task, 0)
  return next(p for i in range(10_000) if (p := t.problem_at(0, i)).answer == str(answer))


def test_tool_calc_episode():
  problem = _problem("tool_calc", make_task("tool_calc", 0).problem_at(0, 0).answer)
  a, b = problem.prompt[:-1].split("*")
  product = int(a) * int(b)
  env = make_env("tool_calc", max_turns=3)
  assert env.reset(problem) == problem.prompt == f"{a}*{b}="
  observation, reward, done, info = env.step(f"<calc {a}*{b}>")
  assert (observation, reward, done) == (str(product), 0.0, False)
  assert info == {"tool_calls": 1, "tool_errors": 0}
  observation, reward, done, info = env.step("<calc 12*")  # cut before its '>'
  assert (observation, reward, done, info["tool_errors"]) == ("error", 0.0, False, 1)
  assert env.step(f" #{product}") == StepResult("", 1.0, True, {"correct": True})
  env.reset(problem)
  assert env.step(f" #{product + 1}") == StepResult("", 0.0, True, {"correct": False})
  assert env.step("no marker").reward == 0.0


def test_tool_calc_hermes():
  """Hermes calls are answered with one tool message per call, in call order (the driver
  renders them with the chat template); parallel calls of one turn all run."""
  env = make_env("tool_calc", tool_format="hermes")
  env.reset(_problem("tool_calc", make_task("tool_calc", 0).problem_at(0, 1).answer))
  call = '<tool_call>{"name": "calc", "arguments": {"expression": "2*21"}}</tool_call>'
  assert env.step(call).observation == [{"role": "tool", "content": "42"}]
  two = ('<tool_call>\n{"name": "calc", "arguments": {"expression": "3*4"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "calc", "arguments": {"expression": "1/0"}}\n</tool_call>')
  result = env.step(two)
  assert result.observation == [{"role": "tool", "content": "12"},
                                {"role": "tool", "content": "error: division by zero"}]
  assert result.info == {"tool_calls": 2, "tool_errors": 1}


def test_guess_episode():
  """Hidden 10 in [1, 16], K = 6: 8 (higher), 12 (lower), a typo (error), 10 at turn 4."""
  env = make_env("guess", max_turns=6)
  problem = _problem("guess", 10)
  assert env.reset(problem) == "guess 1-16:"
  assert env.step("<guess 8>") == StepResult(" higher\n", 0.0, False,
                                             {"tool_calls": 1, "tool_errors": 0})
  assert env.step("<guess 12>").observation == " lower\n"
  result = env.step("<guess ten>")
  assert (result.observation, result.done, result.info["tool_errors"]) == ("error\n", False, 1)
  result = env.step("<guess 10>")
  assert result.done and result.info["correct"]
  assert result.reward == pytest.approx((6 + 1 - 4) / 6)  # shorter is better
  env.reset(problem)
  assert env.step("<guess 10>").reward == 1.0  # first turn: full reward
  env.reset(problem)
  assert env.step("I give up") == StepResult("", 0.0, True, {"correct": False})


def _replay(env, problem, demonstration, close=">", pieces=None):
  """Feed a demonstration's policy turns to ``env``: every observation must be the text that
  follows the turn in the demonstration; returns the last step's result. ``pieces`` (a list)
  receives ``(text, by the policy?)`` of the demonstration's turns and observations in order."""
  pieces = [] if pieces is None else pieces
  env.reset(problem)
  text = demonstration
  while True:
    end = text.find(close)
    turn, text = (text, "") if end < 0 else (text[:end + 1], text[end + 1:])
    pieces.append((turn, True))
    result = env.step(turn)
    if result.done:
      assert not text, f"episode ended with {text!r} left"
      return result
    assert text.startswith(result.observation), (result.observation, text)
    pieces.append((result.observation, False))
    text = text[len(result.observation):]


@pytest.mark.parametrize("task, max_turns", [("tool_calc", 3), ("guess", 5)])
def test_demonstrations_replay_through_the_environment(task, max_turns):
  t = make_task(task, 0)
  used_tool = 0
  for i in range(40):
    problem = t.problem_at(0, i)
    assert problem == t.problem_at(0, i)  # deterministic from (seed, index)
    assert t.format_ok(problem.solution) and t.verify(problem.solution, problem) == 1.0
    result = _replay(make_env(task, max_turns=max_turns), problem, problem.solution)
    assert result.info["correct"] and result.reward > 0
    used_tool += "<" in problem.solution
  assert 0 < used_tool <= 40


@pytest.mark.parametrize("task, max_turns", [("tool_calc", 3), ("guess", 5)])
def test_sft_learns_the_policy_turns_and_not_the_observations(task, max_turns):
  """The SFT cold start's loss mask is 0 exactly on a demonstration's observation tokens (what
  the environment answers when the demonstration is replayed through it) and on the prompt and
  padding, 1 on the policy's tokens and EOS; the observations stay in the input."""
  tok, t = CharTokenizer(), make_task(task, 0)
  # Demonstrations with an observation: a call closed before their end.
  problems = [p for i in range(40) if ">" in (p := t.problem_at(0, i)).solution[:-1]]
  tokens, attn, loss = sft.make_batch(tok, problems, width=100)
  for row, problem in enumerate(problems):
    pieces = []
    _replay(make_env(task, max_turns=max_turns), problem, problem.solution, pieces=pieces)
    assert any(not by_policy for _, by_policy in pieces)
    learned = [int(by_policy) for text, by_policy in pieces for _ in text] + [1]  # and EOS
    prompt = len(tok.encode_prompt(problem.prompt))
    assert loss[row].tolist() == [0] * (100 - len(learned)) + learned
    assert attn[row].sum() == prompt + len(learned)
    assert tok.decode(tokens[row, -len(learned):]) == problem.solution
    if task == "tool_calc":  # the calculator's result is the one unlearned stretch
      a, b = problem.prompt[:-1].split("*")
      assert tok.decode(tokens[row][loss[row] == 0][-len(str(int(a) * int(b))):]) == \
          str(int(a) * int(b)) == problem.answer
      assert (loss[row] == 0).sum() == 100 - len(learned) + len(problem.answer)


def test_guess_eval_set_cycles_through_every_number():
  t = make_task("guess", 0)
  answers = [int(p.answer) for p in t.eval_set(1, 32)]
  assert sorted(answers) == sorted(list(range(1, 17)) * 2)
  assert [p.answer for p in t.eval_set(1, 32)] == [str(a) for a in answers]
  # Demonstrations take at most 5 turns (bisection never needs more: ceil(log2(17))).
  assert max(p.solution.count("<") for p in t.eval_set(1, 64)) <= 5


def test_registry():
  assert {"tool_calc", "guess"} <= set(env_names())
  env_name = KEY_BY_NAME["env.name"].check  # env.name: None or a registered environment
  assert env_name(None) is None and env_name("guess") is None
  assert "registered environment name: " in env_name("gues") and "tool_calc" in env_name("gues")
  with pytest.raises(UnknownNameError,
                     match=r"^unknown environment 'nope' \(env.name\); registered: .*guess, "):
    make_env("nope")

  @register_env("test_echo")
  class Echo(Environment):
    def reset(self, problem):
      return problem.prompt

    def step(self, action):
      return StepResult("", 1.0, True, {"correct": True})
  try:
    assert make_env("test_echo").name == "test_echo"
    with pytest.raises(ValueError, match="already registered"):
      register_env("test_echo")(Echo)
  finally:
    unregister_env("test_echo")
  with pytest.raises(ValueError, match="tool_format"):
    make_env("guess", tool_format="xml")

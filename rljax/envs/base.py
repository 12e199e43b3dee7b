"""The environment protocol and its registry (``env.name``).

An environment is what a multi-turn rollout talks to between the policy's turns:

  env = make_env("tool_calc", max_turns=4, tool_format="compact")
  first = env.reset(problem)          # the first observation: the prompt (text or token ids)
  result = env.step(action)           # action: the text of the policy's turn
  observation, reward, done, info = result

``reset`` must be a function of the problem (the ``G`` rows of a group share its first
observation, prefilled once); ``step`` may keep state on ``self`` (the hidden number, the turns so
far). Both run in killable worker processes (``rljax.envs.runner``): the environment object goes
there and comes back pickled with each call, so it holds plain picklable state, and a step that
hangs past ``env.timeout_s`` or crashes costs its own trajectory (reward 0, counted), never the
run. Observations are text the driver encodes with the tokenizer, token ids used as they are, or
chat messages (``[{"role": "tool", "content": "42"}]``) the driver renders with the tokenizer's
chat template after the policy's turn (its message ends at EOS), through the next assistant header;
their ids are appended to the trajectory as environment tokens: attended to, never trained on.
What an environment returns is checked at the boundary (``rljax.envs.validate``): a result of the
wrong type or range costs its trajectory and is explained in the run dir's ``env_failures.jsonl``.

A new environment is one decorated class::

  @register_env("echo")
  class Echo(Environment):
    def reset(self, problem):
      self.answer = problem.answer
      return problem.prompt
    def step(self, action):
      right = action.strip() == self.answer
      return StepResult("", float(right), True, {"correct": right})
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, List, Sequence, Union

import numpy as np

from rljax.config.table import options
from rljax.errors import StartupError
from rljax.registries import ENVS

# Text, token ids, or chat messages ({"role": ..., "content": ...}) rendered with the chat template.
Observation = Union[str, Sequence[int], Sequence[dict]]
TOOL_FORMATS = options("env.tool_format")


@dataclasses.dataclass
class StepResult:
  """What ``Environment.step`` returns; unpacks as ``(observation, reward, done, info)``.

  Attributes:
    observation: text appended after the policy's turn (encoded by the driver with the
      tokenizer, no special tokens added), token ids in ``[0, vocab)`` appended as they are, or
      chat messages rendered with the chat template; ignored when ``done`` (the policy never
      conditions on it).
    reward: this turn's reward, a real number finite in float32; a trajectory's reward is the
      sum over its turns.
    done: the episode is over (answered, solved, given up); a bool.
    info: a dict of plain values (numbers, strings, bools). Read by the driver: ``correct``
      (a bool, the episode's verdict; False when absent), ``tool_calls`` and ``tool_errors``
      (counts of this turn, ints in ``[0, 10**6]``).
  """
  observation: Observation = ""
  reward: float = 0.0
  done: bool = False
  info: dict = dataclasses.field(default_factory=dict)

  def __iter__(self):
    return iter((self.observation, self.reward, self.done, self.info))


class Environment(abc.ABC):
  """A multi-turn environment (module docstring). Every environment is constructed with the
  run's ``max_turns`` (``env.max_turns``: the driver ends an episode after that many turns;
  environments whose reward depends on it read it here) and ``tool_format`` (``env.tool_format``:
  how tool calls are written, ``rljax.envs.tools``)."""

  name: str = ""
  # Whether episode engines step it (``turn_sync``, ``async_turns``); an agent harness is not
  # stepped: the endpoint engine plays it (``rljax.agents.harness``).
  stepped: bool = True

  def __init__(self, *, max_turns: int = 4, tool_format: str = "compact"):
    if tool_format not in TOOL_FORMATS:
      raise ValueError(f"env.tool_format={tool_format!r}; allowed: {list(TOOL_FORMATS)}")
    self.max_turns = int(max_turns)
    self.tool_format = tool_format

  @abc.abstractmethod
  def reset(self, problem) -> Observation:
    """Start an episode on ``problem`` (a ``rljax.data.tasks.Problem``); returns the first
    observation, which is the prompt the policy continues."""

  @abc.abstractmethod
  def step(self, action: str) -> StepResult:
    """The policy's turn ``action`` (its decoded text: a final EOS dropped, other special
    tokens kept) -> ``StepResult``."""


# --- registry (rljax.registries.ENVS: filled by the modules of rljax.envs) -----------------------

def register_env(name: str):
  """Class decorator adding an ``Environment`` subclass to ``ENVS`` under ``name``."""
  register = ENVS.register(name)

  def add(cls):
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
      raise TypeError(f"register_env({name!r}): {cls!r} is not an Environment subclass")
    register(cls)
    cls.name = name
    return cls
  return add


def unregister_env(name: str) -> None:
  """Removes ``name`` (a notebook re-running the cell that registered it, a test)."""
  ENVS.unregister(name)


def env_names() -> List[str]:
  """The registered environments."""
  return ENVS.names()


def get_env_class(name: str):
  return ENVS.get(name)


def check_engine(name: str, engine: str, steps: bool) -> None:
  """Refuse to run environment ``name`` with ``env.engine=engine`` (which ``steps``
  environments, or plays agent harnesses) when that is not how it runs
  (``Environment.stepped``)."""
  if get_env_class(name).stepped != steps:
    how = ("is stepped: run it with env.engine='turn_sync' or 'async_turns'" if steps is False
           else "is an agent harness: run it with env.engine='endpoint'")
    raise StartupError(f"env.name={name!r} {how}, not env.engine={engine!r}")


def make_env(name: str, *, max_turns: int = 4, tool_format: str = "compact") -> Environment:
  """A fresh environment ``name`` for one episode."""
  return get_env_class(name)(max_turns=max_turns, tool_format=tool_format)


def plain(value: Any, depth: int = 0):
  """``value`` as plain data (numbers, strings, bools, None, lists and dicts of them), what may
  cross from a worker process to the trainer; anything else becomes its ``repr`` (cut short)."""
  if depth > 8:
    return "<too deep>"
  if value is None or isinstance(value, (bool, int, float, str)):
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**63:
      return repr(value)[:80]
    return value
  if isinstance(value, (list, tuple)):
    return [plain(v, depth + 1) for v in list(value)[:1000]]
  if isinstance(value, dict):
    return {str(k)[:100]: plain(v, depth + 1) for k, v in list(value.items())[:100]}
  if isinstance(value, np.generic):
    return plain(value.item(), depth + 1)
  try:
    return repr(value)[:200]
  except BaseException:
    return "<unprintable>"

"""``ToolEnv``: an environment whose turns are tool calls until a final answer.

A turn holding tool calls is answered with their results, in call order (compact: the results'
text; hermes: one tool message per call, ``tools.tool_messages``, which the driver renders with the
tokenizer's chat template) and the episode goes on; a turn without a call is the final answer,
scored by ``score``. Calls that cannot be read or run are answered with an error observation and
counted in ``info['tool_errors']``.
"""
from __future__ import annotations

import abc

from rljax.envs import tools as tools_lib
from rljax.envs.base import Environment, StepResult


class ToolEnv(Environment):
  """Subclasses define ``score(answer) -> (reward, correct)``; ``reset`` keeps the problem and
  returns its prompt; ``call_tool`` runs a registered tool (override it for environment-owned
  tools, e.g. one that reads hidden state)."""

  def reset(self, problem):
    self.problem = problem
    return problem.prompt

  def call_tool(self, call: tools_lib.ToolCall) -> tuple[str, bool]:
    return tools_lib.run_tool(call)

  @abc.abstractmethod
  def score(self, answer: str) -> tuple[float, bool]:
    """``(reward, correct)`` of the final answer ``answer`` (the text of the last turn)."""

  def step(self, action: str) -> StepResult:
    calls = tools_lib.parse_tool_calls(action, self.tool_format)
    if not calls:
      reward, correct = self.score(action)
      return StepResult("", float(reward), True, {"correct": bool(correct)})
    results, errors = [], 0
    for call in calls:
      text, ok = self.call_tool(call)
      errors += not ok
      results.append(tools_lib.result_text(text, ok, self.tool_format))
    return StepResult(tools_lib.tool_observation(results, self.tool_format), 0.0, False,
                      {"tool_calls": len(calls), "tool_errors": errors})

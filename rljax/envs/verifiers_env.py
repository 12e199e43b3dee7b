"""``env.name='verifiers'``: an environment of the ``verifiers`` library run as an rljax environment.

With ``data.source='verifiers:ID'`` (``rljax.data.verifiers_source``: the library's environment,
built once per process, its dataset as the prompts) every episode is one rollout of that
environment, stepped by rljax's multi-turn driver (``rljax.envs.episodes``): rljax's engine
generates each turn from the trajectory's exact token ids, the environment's replies are appended
as observation tokens (masked from the loss), and the library's own code decides everything else.
An episode is the library's ``MultiTurnEnv.rollout`` loop cut at its model calls:

- ``reset``: ``init_state`` (the row of ``Problem.meta['verifiers']``), ``setup_state``,
  ``get_prompt_messages``: the prompt messages are the first observation (chat messages with
  ``data.chat_template``, else the text of ``verifiers_source.prompt_text``);
- ``step(turn)``: the turn becomes the assistant message the library's chat client would have
  returned (text as content; with tools, the calls written in ``env.tool_format`` parsed by
  ``rljax.envs.tools`` into ``tool_calls``, the content the text before the first call),
  ``add_model_response``; then the environment's stop conditions (``is_completed``: its
  ``max_turns``, no tool call, its own ``@vf.stop`` methods, an error) and, if it goes on,
  ``get_prompt_messages`` (its ``env_response``: tool results, a game's reply; at rljax's
  ``env.max_turns`` the rollout ends there, as at the environment's own), whose new messages
  are the observation (chat messages with ``data.chat_template``; else their text, a tool result
  bare in the compact format and as ``<tool_response>`` in hermes);
- when the rollout is complete: ``cleanup`` (the library renders the completion), then
  ``rubric.score_rollout`` and ``rubric.cleanup``, as the library's ``run_rollout`` scores; the
  episode's reward is the rubric's weighted sum, ``info['correct']`` is ``reward >=
  pass_threshold`` (the environment's, 0.5 by default), and the rubric's metrics travel in ``info``.

These calls run in rljax's environment workers (``rljax.envs.runner``): a reward function or an
``env_response`` that hangs past ``env.timeout_s`` or crashes ends its episode with reward 0,
counted in ``env/timeouts`` / ``env/errors`` and explained in ``env_failures.jsonl``; so does a
reward function that raises, which the library itself scores 0 with an error line
(``RubricFailedError``). The library's state travels between the calls with the environment
object (pickled; its usage tracker as plain numbers).

Limits: the library's environments that call a model themselves while stepping (a judge rubric, a
simulated user through ``state['client']``) get a client that refuses (``TurnClient``); group-level
reward functions are refused at start-up (rljax scores each episode alone); an environment whose
``get_prompt_messages`` does not extend the conversation (non-linear histories) ends its episodes
with an error; a turn cut at ``rollout.max_new_tokens`` reaches the library as a complete message.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any, List

from rljax.data import verifiers_source
from rljax.envs import tools as tools_lib
from rljax.envs.base import Environment, StepResult, register_env
from rljax.errors import RljaxError

NAME = verifiers_source.SOURCE_KIND
MODEL = "rljax-policy"  # the model name the library's state records


class RubricFailedError(RljaxError, RuntimeError):
  """A reward function of the rubric raised (the library logged it and scored it 0)."""


class ModelCallRefused(RljaxError, RuntimeError):
  """The environment asked the chat client for a completion while stepping."""


@functools.lru_cache(maxsize=None)
def _turn_client_class():
  """``TurnClient``, a ``vf.Client`` (defined on first use: the library is optional)."""
  vf = verifiers_source.library()

  class TurnClient(vf.Client):
    """The client the library's state holds. rljax's engine writes the policy's turns (the
    driver hands them to ``step``), so a call made by the environment itself while stepping is
    refused with one line naming what is not supported."""

    def __init__(self):
      super().__init__(None)

    def setup_client(self, config):
      return None

    async def to_native_tool(self, tool):
      return tool

    async def to_native_prompt(self, messages):
      return messages, {}

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
      raise ModelCallRefused("the verifiers environment asked its chat client for a completion "
                             "while stepping (a judge or simulated user); rljax's engine writes "
                             "the policy's turns only")

    async def raise_from_native_response(self, response):
      return None

    async def from_native_response(self, response):
      return response

    async def close(self):
      return None

  return TurnClient


def turn_client():
  return _turn_client_class()()


class _ErrorLines(logging.Handler):
  """Collects the library's 'Error calling reward function ...' lines while a rubric scores."""

  def __init__(self):
    super().__init__(logging.ERROR)
    self.lines: List[str] = []

  def emit(self, record):
    message = record.getMessage()
    if message.startswith("Error calling"):
      self.lines.append(message)


def _tool_parameters(state) -> dict:
  """``{tool name: its first parameter}`` (the argument a compact call fills)."""
  first = {}
  for tool in state.get("tool_defs") or []:
    properties = list((tool.parameters or {}).get("properties", {}))
    required = list((tool.parameters or {}).get("required", []))
    first[tool.name] = (required or properties or ["input"])[0]
  return first


def turn_message(action: str, state, tool_format: str, turn: int):
  """``(vf.Response, calls, unreadable)``: the policy's turn as the response the library's chat
  client would return (module docstring)."""
  from verifiers.types import Response, ResponseMessage, ToolCall  # optional extra [verifiers]
  parameters = _tool_parameters(state)
  calls = tools_lib.parse_tool_calls(action, tool_format) if parameters else []
  tool_calls, unreadable = [], 0
  for i, call in enumerate(calls):
    if call.error is not None:
      unreadable += 1
      arguments = call.error  # not JSON: the environment answers it as a malformed call
    else:
      args = dict(call.arguments)
      if "" in args:  # the compact form's one argument
        args = {parameters.get(call.name, "input"): args.pop("")}
      arguments = json.dumps(args)
    tool_calls.append(ToolCall(id=f"call_{turn}_{i}", name=call.name, arguments=arguments))
  content = action
  if tool_calls:
    opener = tools_lib.HERMES_OPEN if tool_format == "hermes" else tools_lib.COMPACT_OPEN
    content = action[:action.find(opener)] if opener in action else action
  message = ResponseMessage(content=content, tool_calls=tool_calls or None,
                            finish_reason="tool_calls" if tool_calls else "stop",
                            is_truncated=False)
  return Response(id=f"rljax-{turn}", created=0, model=MODEL, message=message), len(calls), \
      unreadable


def _role(message) -> str:
  return message.get("role") if isinstance(message, dict) else getattr(message, "role", "user")


def _content(message) -> str:
  return verifiers_source.message_text(
      message.get("content") if isinstance(message, dict) else getattr(message, "content", None))


def observation(messages, chat: bool, tool_format: str):
  """The library's messages as an rljax observation: chat messages with a chat template, else
  their text (a tool result bare in the compact format, ``<tool_response>`` in hermes)."""
  if chat:
    return [{"role": _role(m), "content": _content(m)} for m in messages]
  parts = []
  for m in messages:
    text = _content(m)
    parts.append(tools_lib.render_result(text, True, tool_format) if _role(m) == "tool" else text)
  return "".join(parts)


@register_env(NAME)
class VerifiersEnv(Environment):
  """One rollout of the source's verifiers environment (module docstring)."""

  def __init__(self, *, max_turns: int = 4, tool_format: str = "compact"):
    super().__init__(max_turns=max_turns, tool_format=tool_format)
    self.source: dict = {}
    self.state: Any = None
    self.prompt: list = []
    self.chat = False

  # --- pickling: the library's state crosses to and from the worker processes -------------------

  def __getstate__(self):
    d = dict(self.__dict__)
    if self.state is not None:
      state = type(self.state)(self.state)
      tracker = state.pop("usage_tracker", None)
      state.pop("usage", None)
      state.pop("client", None)  # a TurnClient is rebuilt where the state lands
      usage = dict(tracker.usage) if tracker is not None else None
      d["state"], d["_usage"] = state, usage
    return d

  def __setstate__(self, d):
    usage = d.pop("_usage", None)
    self.__dict__.update(d)
    if self.state is not None:
      from verifiers.utils.usage_utils import StateUsageTracker  # optional extra [verifiers]
      tracker = StateUsageTracker()
      if usage and any(usage.values()):  # an unused tracker stays unseen, as the library's
        tracker.increment(usage.get("input_tokens", 0), usage.get("output_tokens", 0))
      self.state["usage_tracker"], self.state["usage"] = tracker, tracker.usage
      self.state["client"] = turn_client()

  # --- the protocol --------------------------------------------------------------------------------

  @property
  def vf_env(self):
    return verifiers_source.environment(self.source["id"], self.source["args"])

  def reset(self, problem):
    record = problem.meta.get(NAME)
    if record is None:
      raise ValueError(f"env.name='{NAME}' runs problems of data.source='{NAME}:ID' only; this "
                       f"one is not (meta: {sorted(problem.meta)})")
    self.source = {"id": record["id"], "args": record["args"]}
    self.chat = bool(record.get("chat", False))
    return asyncio.run(self._reset(record["row"]))

  async def _reset(self, row):
    env = self.vf_env
    state = await env.init_state(row, turn_client(), MODEL, env.sampling_args)
    state = (await env.setup_state(state)) or state
    self.state = state
    if await env.is_completed(state):
      raise RuntimeError(f"the verifiers environment ended the rollout before the first turn "
                         f"(stop condition {state.get('stop_condition')!r})")
    self.prompt = await self._next_prompt(env, state, [])
    if self.prompt is None:
      raise RuntimeError(f"the verifiers environment ended the rollout before the first turn "
                         f"(stop condition {state.get('stop_condition')!r})")
    return observation(self.prompt, self.chat, self.tool_format)

  async def _next_prompt(self, env, state, conversation):
    """The library's next prompt messages, or None when the rollout is complete (its loop: a
    ``vf.Error`` while building it is recorded in the state, and a stop condition fires)."""
    vf = verifiers_source.library()
    from verifiers.utils.message_utils import maybe_normalize_messages  # optional [verifiers]
    while not await env.is_completed(state):
      try:
        prompt = maybe_normalize_messages(await env.get_prompt_messages(state),
                                          field_name="prompt_messages")
      except vf.Error as e:
        if isinstance(e, vf.OverlongPromptError):
          state["prompt_too_long"], state["is_truncated"] = True, True
        else:
          state["error"] = e
        continue
      if state.get("final_env_response") is not None:
        continue
      if len(prompt) < len(conversation):
        raise RuntimeError("the verifiers environment's next prompt does not extend the "
                           "conversation (a non-linear message history is not supported)")
      return prompt
    return None

  def step(self, action: str) -> StepResult:
    return asyncio.run(self._step(action))

  async def _step(self, action: str) -> StepResult:
    env, state = self.vf_env, self.state
    turn = len(state["trajectory"])
    response, n_calls, unreadable = turn_message(action, state, self.tool_format, turn)
    await env.add_model_response(state, self.prompt, response)
    conversation = list(self.prompt) + list(state["trajectory"][-1]["completion"])
    if len(state["trajectory"]) >= self.max_turns and not await env.is_completed(state):
      # rljax's cap (env.max_turns) below the environment's own: the rollout ends here and is
      # scored, as the library scores one that reaches its max_turns.
      state["is_completed"], state["stop_condition"] = True, "max_turns_reached"
      prompt = None
    else:
      prompt = await self._next_prompt(env, state, conversation)
    counts = {"tool_calls": n_calls, "tool_errors": unreadable}
    if prompt is None:
      reward, info = await self._score(env, state)
      return StepResult("", reward, True, {**info, **counts})
    self.prompt = prompt
    return StepResult(observation(prompt[len(conversation):], self.chat, self.tool_format), 0.0,
                      False, counts)

  async def _score(self, env, state):
    """The library's scoring of a finished rollout: ``(reward, info)``."""
    await env.cleanup(state)
    lines = _ErrorLines()
    logger = logging.getLogger("verifiers")
    logger.addHandler(lines)
    try:
      if env.score_rollouts:
        await env.rubric.score_rollout(state)
      else:
        await env.rubric.dummy_score_rollout(state)
    finally:
      logger.removeHandler(lines)
    await env.rubric.cleanup(state)
    if lines.lines:
      raise RubricFailedError(f"the rubric failed: {lines.lines[0][:300]}")
    reward = float(state["reward"])
    info = {"correct": bool(reward >= env.pass_threshold),
            "stop_condition": str(state.get("stop_condition")),
            **{f"metric/{k}": float(v) for k, v in (state.get("metrics") or {}).items()}}
    if state.get("error") is not None:
      info["error"] = repr(state["error"])[:200]
    return reward, info

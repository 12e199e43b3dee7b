"""Tools, and tool calls read from the model's own output (``env.tool_format``).

Two ways to write a call (``TOOL_FORMATS``):

- ``'hermes'`` (Qwen / Hermes function calling), for Hugging Face tokenizers, written as Qwen's
  chat template writes an assistant message's calls (``render_calls``; parallel calls one per
  block, separated by a newline)::

    <tool_call>
    {"name": "calc", "arguments": {"expression": "123*45"}}
    </tool_call>

  answered with one ``{"role": "tool", "content": "5535"}`` message per call
  (``tool_messages``), which the rollout driver renders with the tokenizer's chat template
  (``Tokenizer.render_followup``), or, for a tokenizer without one, as
  ``<tool_response>\\n5535\\n</tool_response>\\n`` (``render_result``).
- ``'compact'``, for the embedded char-level tasks (whose vocabulary has no braces or quotes):
  ``<NAME ARGS>``, e.g. ``<calc 123*45>``, answered with the bare result, ``5535``. ``ARGS``
  (everything up to ``>``, no ``<``) is the tool's ``compact_arg`` argument.

A compact turn ends at its close marker ``>``, so it holds at most one complete call at its end; a
hermes turn with a chat template is a whole assistant message (it ends at EOS), every call in it
run before the policy continues; without a chat template a hermes turn ends at ``</tool_call>``.
A call that cannot be read (an unclosed ``<``, JSON that does not parse, an unknown tool,
arguments the tool rejects, a tool that raises) becomes an error *observation* (``error``,
``error: <why>`` in hermes), counted as a tool error: never an exception.

A tool is a function of keyword arguments returning text (or a number)::

  @register_tool("upper", compact_arg="text")
  def upper(text: str) -> str:
    return text.upper()
"""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from fractions import Fraction
from typing import Callable, List, Optional

from rljax.envs.base import TOOL_FORMATS
from rljax.registries import TOOLS

# --- the tool registry (rljax.registries.TOOLS: filled by the modules of rljax.envs) -------------


@dataclasses.dataclass(frozen=True)
class Tool:
  name: str
  fn: Callable[..., object]
  compact_arg: str  # the argument ``<name ARGS>`` fills in the compact format
  description: str = ""


def register_tool(name: str, *, compact_arg: str = "input", description: str = ""):
  """Decorator adding ``fn(**arguments) -> str | number`` to ``TOOLS`` as ``name`` (lowercase
  letters and digits, so that the compact form ``<name ...>`` can name it); the registry holds
  its ``Tool`` record."""
  register = TOOLS.register(name)

  def add(fn):
    register(Tool(name, fn, compact_arg, description or (fn.__doc__ or "").split("\n")[0]))
    return fn
  return add


def unregister_tool(name: str) -> None:
  TOOLS.unregister(name)


def tool_names() -> List[str]:
  return TOOLS.names()


class ToolError(Exception):
  """A tool refusing its arguments; the message becomes the error observation."""


# --- parsing -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One call read from a turn: ``name`` and ``arguments``, or ``error`` (why it could not be
  read; then name/arguments may be empty)."""
  name: str = ""
  arguments: dict = dataclasses.field(default_factory=dict)
  error: Optional[str] = None


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
COMPACT_OPEN, COMPACT_CLOSE = "<", ">"
_HERMES_BLOCK = re.compile(re.escape(HERMES_OPEN) + r"(.*?)" + re.escape(HERMES_CLOSE), re.S)
_COMPACT_CALL = re.compile(r"<([a-z][a-z0-9]*)(?: ([^<>]*))?>")


def close_marker(tool_format: str) -> str:
  """The text that ends a turn holding a tool call."""
  _check_format(tool_format)
  return HERMES_CLOSE if tool_format == "hermes" else COMPACT_CLOSE


def _check_format(tool_format: str) -> None:
  if tool_format not in TOOL_FORMATS:
    raise ValueError(f"env.tool_format={tool_format!r}; allowed: {list(TOOL_FORMATS)}")


def parse_tool_calls(text: str, tool_format: str) -> List[ToolCall]:
  """The tool calls written in ``text`` (one turn), in order; malformed ones as ``ToolCall``s with
  ``error`` set. Text without any call gives ``[]`` (a final answer)."""
  _check_format(tool_format)
  return _parse_hermes(text) if tool_format == "hermes" else _parse_compact(text)


def _parse_compact(text: str) -> List[ToolCall]:
  calls, pos = [], 0
  while True:
    start = text.find(COMPACT_OPEN, pos)
    if start < 0:
      return calls
    match = _COMPACT_CALL.match(text, start)
    if match is None:
      end = text.find(COMPACT_CLOSE, start)
      snippet = text[start:end + 1 if end >= 0 else len(text)]
      why = "unclosed tool call" if end < 0 else "malformed tool call"
      calls.append(ToolCall(error=f"{why} {snippet[:40]!r}"))
      if end < 0:
        return calls
      pos = end + 1
      continue
    name, args = match.group(1), match.group(2)
    calls.append(ToolCall(name=name, arguments={"": (args or "").strip()}))
    pos = match.end()


def _parse_hermes(text: str) -> List[ToolCall]:
  calls, pos = [], 0
  for match in _HERMES_BLOCK.finditer(text):
    calls.extend(_stray_open(text[pos:match.start()]))
    pos = match.end()
    calls.append(_hermes_call(match.group(1)))
  calls.extend(_stray_open(text[pos:]))
  return calls


def _stray_open(text: str) -> List[ToolCall]:
  if HERMES_OPEN in text:
    return [ToolCall(error=f"unclosed {HERMES_OPEN} (no {HERMES_CLOSE})")]
  return []


def _hermes_call(body: str) -> ToolCall:
  try:
    payload = json.loads(body)
  except (ValueError, RecursionError) as e:
    return ToolCall(error=f"tool call is not JSON ({str(e)[:60]})")
  if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
    return ToolCall(error='tool call needs {"name": ..., "arguments": {...}}')
  arguments = payload.get("arguments", {})
  if isinstance(arguments, str):  # some models write the arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except (ValueError, RecursionError):
      return ToolCall(name=payload["name"], error="arguments are not a JSON object")
  if not isinstance(arguments, dict):
    return ToolCall(name=payload["name"], error="arguments are not a JSON object")
  return ToolCall(name=payload["name"], arguments=arguments)


# --- running and answering -----------------------------------------------------------------------


def run_tool(call: ToolCall) -> tuple[str, bool]:
  """``(result text, ok)`` of one parsed call; a malformed call, an unknown tool, rejected
  arguments or a tool that raises give ``(why, False)``."""
  if call.error is not None:
    return call.error, False
  if call.name not in TOOLS:
    return f"unknown tool {call.name!r} (tools: {', '.join(TOOLS.names())})", False
  tool = TOOLS.get(call.name)
  arguments = dict(call.arguments)
  if "" in arguments:  # the compact form's one argument
    arguments = {tool.compact_arg: arguments.pop("")}
  try:
    result = tool.fn(**arguments)
  except ToolError as e:
    return str(e), False
  except TypeError as e:
    return f"bad arguments for {call.name}: {str(e)[:80]}", False
  except Exception as e:  # a tool's own bug: the policy sees an error, the run goes on
    return f"{call.name} failed: {type(e).__name__}", False
  return format_number(result) if isinstance(result, (int, float, Fraction)) else str(result), True


def result_text(text: str, ok: bool, tool_format: str) -> str:
  """What answers one call: the result, or the error (``error`` compact, ``error: <why>``
  hermes)."""
  _check_format(tool_format)
  if tool_format == "hermes":
    return text if ok else f"error: {text}"
  return text if ok else "error"


def render_result(text: str, ok: bool, tool_format: str) -> str:
  """The observation text answering one call without a chat template."""
  body = result_text(text, ok, tool_format)
  return f"<tool_response>\n{body}\n</tool_response>\n" if tool_format == "hermes" else body


def tool_messages(results) -> List[dict]:
  """The chat messages answering an assistant message's calls: ``[{"role": "tool", "content":
  text}]``, one per ``text`` of ``results`` in call order (a hermes observation)."""
  return [{"role": "tool", "content": str(text)} for text in results]


def tool_observation(results, tool_format: str):
  """The observation answering a turn's calls, ``results`` their ``result_text``s in call order:
  compact, the texts joined; hermes, one tool message each (``tool_messages``)."""
  _check_format(tool_format)
  return tool_messages(results) if tool_format == "hermes" else "".join(results)


def render_messages(messages) -> str:
  """Chat messages as text for a tokenizer without a chat template: a tool message as
  ``<tool_response>\\n...\\n</tool_response>\\n``, any other message's content as it is."""
  return "".join(f"<tool_response>\n{m['content']}\n</tool_response>\n" if m["role"] == "tool"
                 else m["content"] for m in messages)


def render_calls(calls, tool_format: str) -> str:
  """How the policy writes the calls ``[(name, arguments)]`` of one turn (demonstrations for the
  SFT cold start, docs, tests). Hermes exactly as Qwen's chat template renders an assistant
  message's ``tool_calls`` (its content empty): blocks ``<tool_call>\\n{"name": ..., "arguments":
  ...}\\n</tool_call>`` joined by a newline, the JSON with ``json.dumps`` defaults and unicode
  unescaped, as the template's ``tojson`` writes it."""
  return ("\n" if tool_format == "hermes" else "").join(
      render_call(name, arguments, tool_format) for name, arguments in calls)


def render_call(name: str, arguments: dict, tool_format: str) -> str:
  """How the policy writes one call (``render_calls``)."""
  _check_format(tool_format)
  if tool_format == "hermes":
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{HERMES_OPEN}\n{payload}\n{HERMES_CLOSE}"
  tool = TOOLS.get(name) if name in TOOLS else None
  value = arguments[tool.compact_arg] if tool is not None and tool.compact_arg in arguments \
      else " ".join(str(v) for v in arguments.values())
  return f"<{name} {value}>"


# --- the calculator ------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**30  # any intermediate value beyond this is refused (no 9**9**9 blow-ups)
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b}


def format_number(value) -> str:
  """Integers exactly; other values with at most 6 decimals, trailing zeros dropped."""
  if isinstance(value, Fraction) and value.denominator == 1:
    value = value.numerator
  if isinstance(value, int):
    return str(value)
  value = float(value)
  if not math.isfinite(value):
    raise ToolError("not a finite number")
  if value == int(value) and abs(value) < 2**53:
    return str(int(value))
  return f"{value:.6f}".rstrip("0").rstrip(".")


def _evaluate(node):
  if isinstance(node, ast.Expression):
    return _evaluate(node.body)
  if isinstance(node, ast.Constant) and isinstance(node.value, int) \
      and not isinstance(node.value, bool):
    return Fraction(node.value)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    value = _evaluate(node.operand)
    return -value if isinstance(node.op, ast.USub) else value
  if isinstance(node, ast.BinOp):
    a, b = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Div):
      if b == 0:
        raise ToolError("division by zero")
      value = a / b
    elif type(node.op) in _BINARY:
      value = _BINARY[type(node.op)](a, b)
    else:
      raise ToolError(f"operator {type(node.op).__name__} is not supported")
    if abs(value) > MAX_MAGNITUDE:
      raise ToolError("number too large")
    return value
  raise ToolError("only integers, + - * / and parentheses")


@register_tool("calc", compact_arg="expression")
def calc(expression: str) -> str:
  """Evaluate an arithmetic expression of integers with + - * / and parentheses, exactly."""
  if not isinstance(expression, str):
    raise ToolError("the expression must be text")
  text = expression.strip().rstrip("=").strip()
  if not text:
    raise ToolError("empty expression")
  if len(text) > MAX_EXPRESSION_CHARS:
    raise ToolError("expression too long")
  if not re.fullmatch(r"[0-9+\-*/() ]+", text):
    raise ToolError("only integers, + - * / and parentheses")
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError, RecursionError):
    raise ToolError("not an arithmetic expression") from None
  return format_number(_evaluate(tree))

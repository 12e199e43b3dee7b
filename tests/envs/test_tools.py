"""Tool calls read from the model's own text (compact and hermes), malformed calls as error
observations (never exceptions), the tool registry and the calculator."""
import json

import pytest

from rljax.envs import tools
from rljax.envs.tools import ToolCall, parse_tool_calls, render_result, run_tool


@pytest.mark.parametrize("text, want", [
    ("<calc 123*45>", [ToolCall("calc", {"": "123*45"})]),
    ("let me see <calc 1+2>", [ToolCall("calc", {"": "1+2"})]),
    ("<calc 1+2><calc 3*4>", [ToolCall("calc", {"": "1+2"}), ToolCall("calc", {"": "3*4"})]),
    ("<guess 8>", [ToolCall("guess", {"": "8"})]),
    ("<calc>", [ToolCall("calc", {"": ""})]),
    (" #5535", []),
    ("", []),
])
def test_compact_calls(text, want):
  assert parse_tool_calls(text, "compact") == want


@pytest.mark.parametrize("text, why", [
    ("<calc 12*3", "unclosed tool call"),  # the turn was cut before its '>'
    ("<>", "malformed tool call"),
    ("< calc 1>", "malformed tool call"),
    ("<calc 1<2>", "malformed tool call"),
])
def test_compact_malformed_calls_are_errors(text, why):
  calls = parse_tool_calls(text, "compact")
  assert calls and calls[0].error.startswith(why)
  result, ok = run_tool(calls[0])
  assert not ok and result.startswith(why)
  assert render_result(result, ok, "compact") == "error"


def test_hermes_calls():
  call = {"name": "calc", "arguments": {"expression": "123*45"}}
  text = f"I will compute it.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
  assert parse_tool_calls(text, "hermes") == [ToolCall("calc", {"expression": "123*45"})]
  # Arguments written as a JSON string (some models do) are read too.
  as_string = {"name": "calc", "arguments": json.dumps({"expression": "2+2"})}
  assert parse_tool_calls(f"<tool_call>{json.dumps(as_string)}</tool_call>", "hermes") == [
      ToolCall("calc", {"expression": "2+2"})]
  assert parse_tool_calls("The answer is #4", "hermes") == []
  assert render_result("5535", True, "hermes") == "<tool_response>\n5535\n</tool_response>\n"


@pytest.mark.parametrize("text, why", [
    ("<tool_call>{not json}</tool_call>", "tool call is not JSON"),
    ('<tool_call>["calc"]</tool_call>', 'tool call needs {"name"'),
    ('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', "arguments are not a JSON"),
    ('<tool_call>{"name": "calc", "arguments": {"expression": "1"}}', "unclosed <tool_call>"),
    ('<tool_call>{"name": "calc", "arguments": "{oops"}</tool_call>', "arguments are not a JSON"),
])
def test_hermes_malformed_calls_are_errors(text, why):
  calls = parse_tool_calls(text, "hermes")
  assert calls and calls[-1].error.startswith(why), calls
  result, ok = run_tool(calls[-1])
  assert not ok
  assert render_result(result, ok, "hermes").startswith("<tool_response>\nerror: ")


def test_render_call_round_trips():
  for fmt in ("compact", "hermes"):
    text = tools.render_call("calc", {"expression": "12*3"}, fmt)
    (call,) = parse_tool_calls(text, fmt)
    assert run_tool(call) == ("36", True)
    assert text.endswith(tools.close_marker(fmt))


@pytest.mark.parametrize("expression, want", [
    ("123*45", "5535"), ("123*45+678", "6213"), ("(1+2)*3", "9"), ("-4*5", "-20"),
    ("7/2", "3.5"), ("8/2", "4"), ("1/3", "0.333333"), (" 12 * 3 = ", "36"),
])
def test_calculator(expression, want):
  assert tools.calc(expression) == want
  assert run_tool(ToolCall("calc", {"": expression})) == (want, True)


@pytest.mark.parametrize("expression, why", [
    ("1/0", "division by zero"), ("2**8", "not supported"), ("__import__('os')", "only integers"),
    ("", "empty expression"), ("1+", "not an arithmetic expression"),
    ("9" * 20 + "*" + "9" * 20, "number too large"), ("1" * 300, "expression too long"),
    ("1.5*2", "only integers"),
])
def test_calculator_refuses(expression, why):
  result, ok = run_tool(ToolCall("calc", {"": expression}))
  assert not ok and why in result


def test_registry_unknown_tool_bad_arguments_and_raising_tool():
  assert "calc" in tools.tool_names()
  result, ok = run_tool(ToolCall("nope", {"": "1"}))
  assert not ok and result.startswith("unknown tool 'nope'")
  result, ok = run_tool(ToolCall("calc", {"expr": "1"}))  # hermes with a wrong argument name
  assert not ok and result.startswith("bad arguments for calc")

  @tools.register_tool("testboom", compact_arg="x")
  def boom(x):
    raise RuntimeError("bug")
  try:
    assert run_tool(ToolCall("testboom", {"": "1"})) == ("testboom failed: RuntimeError", False)
    with pytest.raises(ValueError, match="already registered"):
      tools.register_tool("testboom")(boom)
  finally:
    tools.unregister_tool("testboom")
  with pytest.raises(ValueError, match="lowercase"):
    tools.register_tool("Bad_Name")


def test_parallel_hermes_calls_are_written_as_qwen_writes_them():
  calls = (("calc", {"expression": "12*3"}), ("note", {"text": "café ≠ 3"}))
  text = tools.render_calls(calls, "hermes")
  assert text == ('<tool_call>\n{"name": "calc", "arguments": {"expression": "12*3"}}\n'
                  '</tool_call>\n<tool_call>\n{"name": "note", "arguments": {"text": '
                  '"café ≠ 3"}}\n</tool_call>')
  assert parse_tool_calls(text, "hermes") == [ToolCall(n, a) for n, a in calls]
  assert tools.render_calls(calls[:1], "compact") == "<calc 12*3>"

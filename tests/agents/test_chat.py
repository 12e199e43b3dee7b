"""``/v1/chat/completions`` with a Qwen-style chat template: the prompt a request is served is
the template's own rendering of its messages and tools (checked against ``transformers``
directly), tool calls in the answer come back as OpenAI ``tool_calls`` (and a malformed one a
harness sends back is refused naming it), streaming gives the same answer, and a chat harness's
calls are stitched exactly where the template's rendering extends the previous call."""
import dataclasses
import re

import jax
import openai
import pytest
from transformers import AutoTokenizer

from rljax.agents import driver as driver_lib
from rljax.agents import harness as harness_lib
from rljax.agents import protocol
from rljax.agents.harness import register_harness
from rljax.data.tasks import Problem
from rljax.data.tokenizer import load_tokenizer
from rljax.envs.episodes import EnvSettings
from rljax.models import transformer
from rljax.rollout.engines import JaxEngine
from tests.envs.chat_templates import build_tokenizer
from tests.envs.test_driver import SP, tiny_model_config

CALC = {"type": "function", "function": {
    "name": "calc", "description": "integer arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}
MESSAGES = [{"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": "What is 12*3?"}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return load_tokenizer(build_tokenizer("qwen2.5", str(tmp_path_factory.mktemp("tok") / "q")),
                        chat_template=True)


def test_the_prompt_is_the_templates_rendering_with_the_tools(tok):
  call = protocol.parse_chat({"messages": MESSAGES, "tools": [CALC]}, tok)
  hf = AutoTokenizer.from_pretrained(tok.path)
  want = hf.apply_chat_template(MESSAGES, tools=[CALC], tokenize=False, add_generation_prompt=True)
  assert list(call.prompt_ids) == hf.encode(want, add_special_tokens=False)
  assert call.tool_params == {"calc": "expression"}


def test_a_call_in_the_answer_is_an_openai_tool_call(tok):
  call = protocol.parse_chat({"messages": MESSAGES, "tools": [CALC]}, tok)
  raw = 'Let me see.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12*3"}}\n</tool_call>'
  body, n_calls, unreadable = protocol.answer(
      call, protocol.Answer(raw, "stop", call.prompt_ids, (1, 2), raw), "hermes")
  choice = body["choices"][0]
  assert choice["finish_reason"] == "tool_calls" and (n_calls, unreadable) == (1, 0)
  (tool_call,) = choice["message"]["tool_calls"]
  assert tool_call["function"] == {"name": "calc", "arguments": '{"expression": "12*3"}'}
  assert choice["message"]["content"] == "Let me see.\n"
  bad = raw.replace('{"expression": "12*3"}', "{not json")
  body, n_calls, unreadable = protocol.answer(
      call, protocol.Answer(bad, "stop", call.prompt_ids, (1,), bad), "hermes")
  assert body["choices"][0]["message"] == {"role": "assistant", "content": bad}
  assert unreadable == 1 and body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("message,says", [
    ({"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "calc", "arguments": "{oops"}}]},
     "malformed tool call at messages[2].tool_calls[0]: function.arguments is not JSON"),
    ({"role": "assistant", "tool_calls": [{"id": "1", "function": {"arguments": "{}"}}]},
     "malformed tool call at messages[2].tool_calls[0]: needs function.name"),
    ({"role": "robot", "content": "hi"}, "messages[2]: a message needs a role")])
def test_a_malformed_message_is_refused_naming_it(tok, message, says):
  with pytest.raises(protocol.RequestError, match=re.escape(says)):
    protocol.parse_chat({"messages": MESSAGES + [message]}, tok)


@pytest.mark.parametrize("body,says", [
    ({"n": 3}, "n=3"), ({"tool_choice": "required"}, "tool_choice"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"stop": ["a"] * 5}, "stop="),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"response_format": {"type": "json_object"}}, "response_format")])
def test_what_the_endpoint_cannot_honour_is_refused(tok, body, says):
  with pytest.raises(protocol.RequestError, match=re.escape(says)):
    protocol.parse_chat({"messages": MESSAGES, **body}, tok)


def test_a_model_without_chat_template_sends_chat_requests_to_completions():
  with pytest.raises(protocol.RequestError, match="use /v1/completions"):
    protocol.parse_chat({"messages": MESSAGES}, load_tokenizer("char"))


if "t_chat" not in harness_lib.HARNESSES:
  @register_harness("t_chat")
  def t_chat(task):
    """Two chat calls (the first streamed): the answer appended as the assistant's message,
    then a user turn; returns the streamed and the final texts."""
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    messages = list(MESSAGES)
    chunks = client.chat.completions.create(model=task.model, messages=messages, tools=[CALC],
                                            max_tokens=6, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    messages += [{"role": "assistant", "content": streamed},
                 {"role": "user", "content": "Again."}]
    out = client.chat.completions.create(model=task.model, messages=messages, max_tokens=6)
    return {"reward": 1.0, "info": {"streamed": streamed,
                                    "final": out.choices[0].message.content}}

  @register_harness("t_badtool")
  def t_badtool(task):
    """One call, then a second whose history holds a tool call with arguments that are not
    JSON (as a harness that forwards the model's text unparsed might send)."""
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    out = client.chat.completions.create(model=task.model, messages=MESSAGES, max_tokens=6)
    call = {"id": "1", "type": "function", "function": {"name": "calc", "arguments": "{12*3"}}
    client.chat.completions.create(model=task.model, max_tokens=6, messages=MESSAGES + [
        {"role": "assistant", "content": out.choices[0].message.content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "1", "content": "36"}])
    return 1.0


@pytest.fixture(scope="module")
def chat_engine(tok):
  c = tiny_model_config()
  cfg = dataclasses.replace(c, vocab_size=tok.vocab_size, eos_token_id=tok.eos_id,
                            pad_token_id=tok.pad_id)
  base = JaxEngine(cfg)
  base.load_weights(jax.tree.map(lambda x: 4.0 * x, transformer.init_params(cfg, seed=1)), 0)
  settings = EnvSettings(name="t_chat", engine="endpoint", max_tokens=128, timeout_s=120.0,
                         harness_workers=2, tool_format="hermes", max_prompt_tokens=200)
  engine = driver_lib.EndpointEngine(base, settings, tok, prompt_bucket=32)
  sp = dataclasses.replace(SP, stop_ids=(tok.eos_id,), pad_id=tok.pad_id, max_new_tokens=8)
  try:
    yield engine, sp
  finally:
    engine.close()
    harness_lib.close_harness_pool()


def _play(chat_engine, name: str):
  engine, sp = chat_engine
  engine.settings = dataclasses.replace(engine.settings, name=name)
  return engine.episodes([Problem("q", "0")], jax.random.PRNGKey(0), sp, 2)


@pytest.fixture(scope="module")
def chat_result(chat_engine):
  return _play(chat_engine, "t_chat")


def test_a_chat_harness_is_served_and_stitched_where_the_template_extends(chat_result, tok):
  hf = AutoTokenizer.from_pretrained(tok.path)
  for ep, calls in zip(chat_result.episodes, chat_result.calls):
    first, second = calls
    want = hf.apply_chat_template(MESSAGES, tools=[CALC], tokenize=False,
                                  add_generation_prompt=True)
    assert first.prompt_ids == hf.encode(want, add_special_tokens=False)
    assert ep.infos[0]["streamed"] == tok.decode(first.completion_ids)
    assert ep.infos[0]["final"] == tok.decode(second.completion_ids)
    before = first.prompt_ids + first.completion_ids
    extends = second.prompt_ids[:len(before)] == before
    row = chat_result.episodes.index(ep)
    assert chat_result.rollout.extras["segment"][row].max() == (1 if extends else 2)


def test_a_malformed_tool_call_fails_its_episode_counted_and_explained(chat_engine):
  """The endpoint answers the malformed call with a 400 naming it; the harness (the ``openai``
  client raising on it) fails its own episode: reward 0, counted, the 400's reason in its error."""
  out = _play(chat_engine, "t_badtool")
  assert out.counts["agent/refused"] == 2 and out.counts["env/errors"] == 2
  for ep in out.episodes:
    assert ep.end == "error" and ep.reward == 0.0
    assert "malformed tool call at messages[2].tool_calls[0]: function.arguments is not JSON" \
        in ep.error, ep.error
  assert out.counts["agent/calls"] == 2  # the first calls were served, the malformed refused

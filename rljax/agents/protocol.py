"""The OpenAI wire format of the agent endpoint: requests in, token ids out, answers back.

``/v1/chat/completions``: ``messages`` (and ``tools``, function definitions) are rendered by the
tokenizer's chat template (``Tokenizer.render_chat``, with the generation prompt) and encoded;
an assistant message's ``tool_calls`` have their JSON ``arguments`` parsed first (templates
render them as objects, as vLLM does). The answer's text is parsed for tool calls in the run's
format (``env.tool_format``, ``rljax.envs.tools``): with ``tools`` in the request, the calls
become the message's ``tool_calls`` (``finish_reason`` 'tool_calls') and ``content`` the text
before the first one; a call that cannot be read leaves the whole text as ``content``.

``/v1/completions``: ``prompt`` is text (encoded, the tokenizer's BOS first when it has one, as
``Tokenizer.encode_prompt`` does without a chat template) or a list of token ids used as they
are (a harness that keeps ids never meets re-tokenisation).

Both: ``max_tokens`` (``max_completion_tokens``) caps the answer below ``rollout.max_new_tokens``
and the episode's room; ``stop`` (up to 4 strings) ends it at the first token that completes one
(the text stops before it, the token stays in the record: a harness that appends the stop string
to its history extends the previous call); ``stream`` answers as server-sent events, the whole
answer in one delta once drawn, then the finish reason. The sampling is the run's
(``rollout.temperature``, ``top_p``, ``top_k``; greedy in evaluation), whatever the request's
``temperature``, ``top_p``, ``seed`` or penalties say: the record must be the policy's own
distribution. What the endpoint cannot honour (``n`` > 1, ``logit_bias``, ``echo``, ``best_of``,
``suffix``, a ``tool_choice`` forcing a call, a JSON ``response_format``) is a 400 naming it.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Optional, Sequence

from rljax.envs import tools as tools_lib
from rljax.errors import RljaxError

MODEL_NAME = "rljax-policy"
MAX_STOPS = 4
ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(RljaxError, ValueError):
  """A request the endpoint refuses: ``status`` (400, 404, 409, 503) and the OpenAI error's
  ``code`` (``context_length_exceeded``, ``invalid_request_error``, ...)."""

  def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.code = status, code

  def body(self) -> dict:
    return {"error": {"message": str(self), "type": "invalid_request_error", "param": None,
                      "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Call:
  """One parsed request: its ``prompt_ids``, what caps and ends its answer, how to answer."""
  kind: str  # 'chat' or 'completion'
  prompt_ids: tuple
  max_tokens: Optional[int] = None
  stop: tuple = ()
  stream: bool = False
  include_usage: bool = False
  tool_params: Optional[dict] = None  # {tool name: its first parameter}: parse calls; None: not
  model: str = MODEL_NAME


def _refuse_unsupported(body: dict) -> None:
  if body.get("n", 1) not in (1, None):
    raise RequestError(f"n={body['n']}: the endpoint answers one choice per request (n=1)")
  if body.get("best_of", 1) not in (1, None):
    raise RequestError(f"best_of={body['best_of']}: not supported (best_of=1)")
  for field in ("logit_bias", "suffix"):
    if body.get(field):
      raise RequestError(f"{field}: not supported by the training endpoint")
  if body.get("echo"):
    raise RequestError("echo=true: not supported by the training endpoint")
  choice = body.get("tool_choice")
  if choice not in (None, "auto", "none"):
    raise RequestError(f"tool_choice={json.dumps(choice)[:80]}: the policy decides whether to "
                       "call a tool ('auto' or 'none' only)")
  fmt = (body.get("response_format") or {}).get("type", "text") \
      if isinstance(body.get("response_format"), dict) else "text"
  if fmt != "text":
    raise RequestError(f"response_format {fmt!r}: the policy's output is not constrained "
                       "(type 'text' only)")


def _limits(body: dict) -> tuple[Optional[int], tuple]:
  """``(max_tokens, stop strings)`` of a request."""
  cap = body.get("max_completion_tokens", body.get("max_tokens"))
  if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
    raise RequestError(f"max_tokens={cap!r} must be a positive integer")
  stop = body.get("stop")
  stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
  if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOPS or not all(
      isinstance(s, str) and s for s in stop):
    raise RequestError(f"stop={json.dumps(body.get('stop'))[:80]} must be a non-empty string "
                       f"or a list of at most {MAX_STOPS}")
  return cap, tuple(stop)


def _text(content, where: str) -> str:
  if content is None or isinstance(content, str):
    return content or ""
  if isinstance(content, list):
    parts = []
    for part in content:
      if not (isinstance(part, dict) and part.get("type") == "text"
              and isinstance(part.get("text"), str)):
        raise RequestError(f"{where}: only text content parts are supported")
      parts.append(part["text"])
    return "".join(parts)
  raise RequestError(f"{where}: content must be a string or a list of text parts")


def _tool_call(call, where: str) -> dict:
  """An assistant message's tool call, its arguments parsed (malformed: a 400 naming it)."""
  fn = call.get("function") if isinstance(call, dict) else None
  if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
    raise RequestError(f"malformed tool call at {where}: needs function.name")
  arguments = fn.get("arguments", "{}")
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments or "{}")
    except json.JSONDecodeError as e:
      raise RequestError(f"malformed tool call at {where}: function.arguments is not JSON "
                         f"({e.msg})") from None
  if not isinstance(arguments, dict):
    raise RequestError(f"malformed tool call at {where}: function.arguments is not a JSON object")
  return {"id": str(call.get("id") or ""), "type": "function",
          "function": {"name": fn["name"], "arguments": arguments}}


def chat_messages(messages) -> list[dict]:
  """The request's messages as the chat template reads them (checked)."""
  if not isinstance(messages, list) or not messages:
    raise RequestError("messages must be a non-empty list")
  out = []
  for i, m in enumerate(messages):
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
      raise RequestError(f"{where}: a message needs a role in {list(ROLES)}")
    msg = {"role": m["role"], "content": _text(m.get("content"), where)}
    if m.get("tool_calls"):
      if m["role"] != "assistant" or not isinstance(m["tool_calls"], list):
        raise RequestError(f"{where}: tool_calls belong to assistant messages, as a list")
      msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]")
                           for j, c in enumerate(m["tool_calls"])]
    if m["role"] == "tool" and m.get("tool_call_id") is not None:
      msg["tool_call_id"] = str(m["tool_call_id"])
    if m.get("name") is not None:
      msg["name"] = str(m["name"])
    out.append(msg)
  return out


def tool_parameters(tools) -> dict:
  """``{name: first parameter}`` of the request's function tools (the argument a compact call
  fills); checked."""
  if not isinstance(tools, list):
    raise RequestError("tools must be a list of function definitions")
  params = {}
  for i, tool in enumerate(tools):
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
      raise RequestError(f"tools[{i}]: needs type 'function' and function.name")
    schema = fn.get("parameters") or {}
    names = list(schema.get("required") or []) + list((schema.get("properties") or {}))
    params[fn["name"]] = names[0] if names else "input"
  return params


def parse_chat(body: dict, tokenizer) -> Call:
  """A ``/v1/chat/completions`` request as a ``Call``."""
  _refuse_unsupported(body)
  cap, stop = _limits(body)
  messages = chat_messages(body.get("messages"))
  tools = body.get("tools") or None
  params = tool_parameters(tools) if tools else None
  if body.get("tool_choice") == "none":
    params = None
  try:
    ids = tokenizer.encode(tokenizer.render_chat(messages, tools))
  except RljaxError as e:
    raise RequestError(f"{e} (use /v1/completions with this model)") from None
  return Call("chat", tuple(_with_bos(tokenizer, ids)), cap, stop, bool(body.get("stream")),
              _include_usage(body), params, str(body.get("model") or MODEL_NAME))


def parse_completion(body: dict, tokenizer) -> Call:
  """A ``/v1/completions`` request as a ``Call``."""
  _refuse_unsupported(body)
  cap, stop = _limits(body)
  prompt = body.get("prompt")
  if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
    prompt = prompt[0]  # one prompt in a batch of one
  if isinstance(prompt, str):
    try:
      ids = _with_bos(tokenizer, tokenizer.encode(prompt))
    except RljaxError as e:
      raise RequestError(f"prompt: {e}") from None
  elif isinstance(prompt, list) and prompt and all(
      isinstance(i, int) and not isinstance(i, bool) for i in prompt):
    if not all(0 <= i < tokenizer.vocab_size for i in prompt):
      raise RequestError(f"prompt: token ids must lie in [0, {tokenizer.vocab_size})")
    ids = list(prompt)
  else:
    raise RequestError("prompt must be a string or a non-empty list of token ids (one prompt)")
  return Call("completion", tuple(ids), cap, stop, bool(body.get("stream")),
              _include_usage(body), None, str(body.get("model") or MODEL_NAME))


def _include_usage(body: dict) -> bool:
  options = body.get("stream_options")
  return bool(isinstance(options, dict) and options.get("include_usage"))


def _with_bos(tokenizer, ids) -> list:
  ids = list(ids)
  if tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
    ids = [tokenizer.bos_id] + ids
  return ids


# --- answers ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Answer:
  """What the engine drew for a call: the text (special tokens skipped, as vLLM does; any stop
  string cut), whether it ended at a stop ('stop') or its cap ('length'), and the ids."""
  text: str
  finish: str
  prompt_ids: tuple
  completion_ids: tuple
  raw: str = ""  # the text with special tokens kept (tool calls are read from it)


def _message(call: Call, text: str, raw: str, tool_format: str) -> tuple[dict, str, int, int]:
  """``(assistant message, finish override or '', tool calls, unreadable calls)``: calls are
  read from ``raw`` (special tokens kept: a tokenizer may hold the call markers as such)."""
  if call.tool_params is None:
    return {"role": "assistant", "content": text}, "", 0, 0
  calls = tools_lib.parse_tool_calls(raw, tool_format)
  if not calls:
    return {"role": "assistant", "content": text}, "", 0, 0
  if any(c.error is not None for c in calls):
    return {"role": "assistant", "content": text}, "", 0, sum(c.error is not None for c in calls)
  out = []
  for k, c in enumerate(calls):
    args = dict(c.arguments)
    if "" in args:  # the compact form's one argument
      args = {call.tool_params.get(c.name, "input"): args.pop("")}
    out.append({"id": f"call_{uuid.uuid4().hex[:12]}_{k}", "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(args)}})
  opener = tools_lib.HERMES_OPEN if tool_format == "hermes" else tools_lib.COMPACT_OPEN
  content = raw[:raw.find(opener)]
  return ({"role": "assistant", "content": content or None, "tool_calls": out}, "tool_calls",
          len(out), 0)


def answer(call: Call, drawn: Answer, tool_format: str) -> tuple[dict, int, int]:
  """``(the response body, tool calls returned, tool calls that could not be read)``."""
  p, n = len(drawn.prompt_ids), len(drawn.completion_ids)
  usage = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
  created = int(time.time())
  # The ids, as vLLM's ``return_token_ids`` gives them: a harness may keep its history as ids.
  ids = {"prompt_token_ids": list(drawn.prompt_ids), "token_ids": list(drawn.completion_ids)}
  if call.kind == "completion":
    return ({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": created,
             "model": call.model, "choices": [{"index": 0, "text": drawn.text, "logprobs": None,
                                               "finish_reason": drawn.finish, **ids}],
             "usage": usage}, 0, 0)
  message, finish, n_calls, unreadable = _message(call, drawn.text, drawn.raw or drawn.text,
                                                  tool_format)
  return ({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
           "created": created, "model": call.model,
           "choices": [{"index": 0, "message": message, "logprobs": None,
                        "finish_reason": finish or drawn.finish, **ids}], "usage": usage},
          n_calls, unreadable)


def stream_events(call: Call, body: dict) -> list[bytes]:
  """A finished answer as server-sent events: the whole delta, the finish reason, the usage
  when asked for, ``[DONE]``."""
  choice = body["choices"][0]
  base = {k: body[k] for k in ("id", "created", "model")}
  ids = {k: choice[k] for k in ("prompt_token_ids", "token_ids")}
  if call.kind == "completion":
    kind = "text_completion"
    chunks = [dict(index=0, text=choice["text"], logprobs=None, finish_reason=None, **ids),
              dict(index=0, text="", logprobs=None, finish_reason=choice["finish_reason"])]
  else:
    kind = "chat.completion.chunk"
    delta = {"role": "assistant", "content": choice["message"].get("content")}
    if choice["message"].get("tool_calls"):
      delta["tool_calls"] = [dict(c, index=i)
                             for i, c in enumerate(choice["message"]["tool_calls"])]
    chunks = [dict(index=0, delta=delta, logprobs=None, finish_reason=None, **ids),
              dict(index=0, delta={}, logprobs=None, finish_reason=choice["finish_reason"])]
  events = [dict(base, object=kind, choices=[c]) for c in chunks]
  if call.include_usage:
    events.append(dict(base, object=kind, choices=[], usage=body["usage"]))
  return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def cut_at_stop(text_of, ids: Sequence[int], stops: Sequence[str]) -> Optional[tuple[int, str]]:
  """``(tokens kept, text before the stop)`` where ``ids`` first complete a stop string, or None.
  ``text_of(ids)`` decodes; the kept tokens are the shortest prefix whose text holds a stop."""
  if not stops:
    return None
  full = text_of(ids)
  hits = [(full.find(s), s) for s in stops if s in full]
  if not hits:
    return None
  at, _ = min(hits)
  for n in range(1, len(ids) + 1):
    text = text_of(ids[:n])
    if any(s in text for s in stops):
      first = min(text.find(s) for s in stops if s in text)
      return n, text[:first]
  return len(ids), full[:at]

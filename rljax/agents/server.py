"""The endpoint's HTTP half: an OpenAI-compatible server on the loopback, one base URL per
episode (``http://127.0.0.1:PORT/e/<episode token>/v1``), so that every request is known to
belong to its episode without trusting anything the harness sends.

Routes: ``POST .../v1/chat/completions``, ``POST .../v1/completions``, ``GET .../v1/models``.
Each request is parsed and tokenised on its own thread (``rljax.agents.protocol``), handed to the
batch of episodes being served (``rljax.agents.serving.Batch``), and answered when its call is
drawn: JSON, or server-sent events with ``stream``. A request the endpoint refuses is an OpenAI
error body with its status (400 a malformed or unsupported request or a prompt over the
context, 404 an unknown or finished episode, 413 a body over ``MAX_BODY`` bytes, 503 no batch
answering). The server is started once per engine and lives until ``close``.
"""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Optional

from rljax.agents import protocol
from rljax.agents.serving import Batch, wait_reply

MAX_BODY = 16 << 20
HOST = "127.0.0.1"


class EndpointServer:
  """The HTTP server; ``attach(batch, tokens)`` routes episode tokens to rows of a batch."""

  def __init__(self, tokenizer, reply_timeout_s: float):
    self.tokenizer, self.reply_timeout_s = tokenizer, reply_timeout_s
    self._lock = threading.Lock()
    self._batch: Optional[Batch] = None
    self._rows: Dict[str, int] = {}
    handler = type("Handler", (_Handler,), {"endpoint": self})
    self.httpd = _Server((HOST, 0), handler)
    self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                   name="rljax-endpoint")
    self.thread.start()

  @property
  def port(self) -> int:
    return self.httpd.server_address[1]

  def base_url(self, token: str) -> str:
    return f"http://{HOST}:{self.port}/e/{token}/v1"

  def attach(self, batch: Batch, rows: Dict[str, int]) -> None:
    with self._lock:
      self._batch, self._rows = batch, dict(rows)

  def detach(self) -> None:
    with self._lock:
      self._batch, self._rows = None, {}

  def route(self, token: str):
    with self._lock:
      if self._batch is None or token not in self._rows:
        raise protocol.RequestError(f"no episode {token!r} is being served", 404,
                                    "episode_not_found")
      return self._batch, self._rows[token]

  def close(self) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()
    self.thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
  daemon_threads = True
  # The listen backlog: socketserver's default of 5 refused connections (an APIConnectionError
  # in the harness) when a batch's harnesses connected at once on a loaded machine.
  request_queue_size = 1024

  def handle_error(self, request, client_address):
    """A harness killed mid-request (its episode timed out) resets its connection: nothing to
    report. Anything else would be a bug of the handler: it raises in the request's thread."""
    if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
      super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
  endpoint: EndpointServer = None
  protocol_version = "HTTP/1.1"

  def log_message(self, format, *args):  # the trainer's log is not an access log
    return

  def _send(self, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def _stream(self, events) -> None:
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Cache-Control", "no-cache")
    self.send_header("Content-Length", str(sum(len(e) for e in events)))
    self.end_headers()
    for event in events:
      self.wfile.write(event)

  def _route(self):
    """``(token, route after /v1)``; a path of another shape is a 404."""
    parts = self.path.split("?")[0].strip("/").split("/")
    if len(parts) < 4 or parts[0] != "e" or parts[2] != "v1":
      raise protocol.RequestError(f"no route {self.path!r}: use the episode's base URL "
                                  "(.../e/<episode>/v1)", 404, "not_found")
    return parts[1], "/".join(parts[3:])

  def do_GET(self):
    try:
      token, route = self._route()
      self.endpoint.route(token)
      if route != "models":
        raise protocol.RequestError(f"no route GET /v1/{route}", 404, "not_found")
      self._send(200, {"object": "list", "data": [
          {"id": protocol.MODEL_NAME, "object": "model", "created": 0, "owned_by": "rljax"}]})
    except protocol.RequestError as e:
      self._send(e.status, e.body())

  def do_POST(self):
    try:
      token, route = self._route()
      length = int(self.headers.get("Content-Length") or 0)
      if length > MAX_BODY:
        raise protocol.RequestError(f"a request body of {length} bytes is over {MAX_BODY}", 413,
                                    "request_too_large")
      raw = self.rfile.read(length)
      batch, row = self.endpoint.route(token)
      parse = {"chat/completions": protocol.parse_chat,
               "completions": protocol.parse_completion}.get(route)
      if parse is None:
        raise protocol.RequestError(f"no route POST /v1/{route}", 404, "not_found")
      try:
        body = json.loads(raw or b"null")
      except ValueError as e:
        raise protocol.RequestError(f"the request body is not JSON ({e})") from None
      if not isinstance(body, dict):
        raise protocol.RequestError("the request body must be a JSON object")
      try:
        call = parse(body, self.endpoint.tokenizer)
      except protocol.RequestError as e:
        batch.refuse(row, str(e))
        raise
      reply = wait_reply(batch.submit(row, call), self.endpoint.reply_timeout_s)
      if isinstance(reply, protocol.RequestError):
        raise reply
      body, _ = reply
      if call.stream:
        self._stream(protocol.stream_events(call, body))
      else:
        self._send(200, body)
    except protocol.RequestError as e:
      self._send(e.status, e.body())
    except (BrokenPipeError, ConnectionResetError):  # the harness went away
      return

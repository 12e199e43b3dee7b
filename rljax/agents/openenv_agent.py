"""OpenEnv environments (``openenv`` on PyPI: an environment as an HTTP/WebSocket server) played
by a harness through the endpoint.

An OpenEnv server keeps an episode's state per WebSocket session (``/ws``: ``reset``, ``step``,
``close`` messages; its HTTP ``/reset`` and ``/step`` build a fresh environment per request), so
an episode must be played by one process holding one connection from reset to the end. rljax's
stepped-environment seam cannot do that (its environment objects travel pickled between worker
processes from one step to the next), so an OpenEnv environment is a *harness*: one worker
process per episode opens the session, and each turn asks the policy through the endpoint
(``/v1/completions``, the transcript so far) and sends its answer as the action::

  register_harness("echo")(openenv_harness(
      command=["python", "-m", "uvicorn", "echo_env.server.app:app", "--port", "8123"],
      url="http://127.0.0.1:8123", cwd="envs", action_field="message",
      observation_field="echoed_message", max_steps=4))

``url``: the server's address; with ``command`` rljax starts the server there as a subprocess
before the harness workers fork (waiting for ``/health``) and stops it with the engine. Each
turn's action is ``{action_field: the answer's text}``; the observation appended to the
transcript is ``observation[observation_field]`` (or the observation's JSON without one); the
episode's reward is the sum of the steps' rewards, until ``done`` or ``max_steps``. The client
needs only ``websockets`` (the ``[openenv]`` extra); the server runs with the ``openenv`` package
in its own environment (a container, a Space, a virtual environment), as OpenEnv deploys them.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Callable, Optional, Sequence

from rljax.agents.harness import AgentTask
from rljax.errors import StartupError

START_S = 120.0  # longest wait for a started server's /health
STDERR_LINES = 20  # the last lines of a started server's stderr kept for its start-up error


def _drain(stream, tail: collections.deque) -> None:
  """Reads ``stream`` to its end, keeping its last lines in ``tail``: a server logs to stderr
  for as long as it runs (uvicorn a line per connection), and a pipe nobody reads blocks the
  server once its 64 KiB are full."""
  for line in iter(stream.readline, b""):
    tail.append(line.decode(errors="replace").rstrip())
  stream.close()


class OpenEnvServer:
  """A server at ``url``, started from ``command`` when given (``start``), stopped by ``stop``
  (``env``: the started process's environment variables, None = this process's; ``what``: the
  server in messages; also the verifiers v1 bridge, ``rljax.agents.verifiers_v1``)."""

  def __init__(self, url: str, command: Optional[Sequence[str]] = None,
               cwd: Optional[str] = None, env: Optional[dict] = None,
               what: str = "the OpenEnv server"):
    self.url, self.command, self.cwd = url.rstrip("/"), command, cwd
    self.env, self.what = env, what
    self.process: Optional[subprocess.Popen] = None

  def healthy(self) -> bool:
    try:
      with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
        return r.status == 200
    except OSError:
      return False

  def start(self) -> None:
    if self.command is None or self.process is not None:
      return
    self.process = subprocess.Popen(list(self.command), cwd=self.cwd, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env=self.env)
    tail = collections.deque(maxlen=STDERR_LINES)
    drain = threading.Thread(target=_drain, args=(self.process.stderr, tail), daemon=True,
                             name="rljax-server-stderr")
    drain.start()
    # In a session of its own, the server outlives its starter unless stopped: a run that ends
    # other than by closing its engine (preempted by SIGTERM, a crash) stops it on exit too
    # (the starter only: a forked copy that exits normally must not stop it).
    starter = os.getpid()
    atexit.register(lambda: os.getpid() == starter and self.stop())
    deadline = time.monotonic() + START_S
    while not self.healthy():
      if self.process.poll() is not None:
        drain.join(timeout=5)  # its last lines, read to the end of the closed pipe
        last = next((line for line in reversed(tail) if line.strip()), "")
        raise StartupError(f"{self.what} {list(self.command)} exited "
                           f"{self.process.returncode}: {last.strip()[:300]}")
      if time.monotonic() > deadline:
        self.stop()
        raise StartupError(f"{self.what} at {self.url} did not answer /health in "
                           f"{START_S:.0f} s")
      time.sleep(0.2)

  def stop(self) -> None:
    if self.process is not None:
      try:
        os.killpg(self.process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      self.process.wait(timeout=10)
      self.process = None


def _receive(ws) -> dict:
  message = json.loads(ws.recv())
  if message.get("type") == "error":
    raise RuntimeError(f"the OpenEnv server refused: {message.get('data')}")
  return message.get("data") or {}


def openenv_harness(*, url: str, command: Optional[Sequence[str]] = None,
                    cwd: Optional[str] = None, action_field: str = "message",
                    observation_field: Optional[str] = None, max_steps: int = 4,
                    max_tokens: int = 32, render: Callable[[str], str] = str):
  """A harness playing the OpenEnv server at ``url`` (module docstring); register it with
  ``register_harness``. ``render``: the observation's text as the transcript shows it (e.g.
  ``str.lower`` for a vocabulary without capitals)."""
  server = OpenEnvServer(url, command, cwd)

  def observed(result: dict) -> str:
    obs = result.get("observation") or {}
    return render(str(obs.get(observation_field, "")) if observation_field else json.dumps(obs))

  def play(task: AgentTask):
    import openai  # the optional [agents] extra: harness processes only
    from websockets.sync.client import connect  # optional extra [openenv]
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    ws_url = "ws" + server.url[len("http"):] + "/ws"
    total, steps = 0.0, 0
    with connect(ws_url, open_timeout=30) as ws:
      ws.send(json.dumps({"type": "reset", "data": {}}))
      result = _receive(ws)
      transcript = task.problem.prompt + observed(result)
      while steps < max_steps and not result.get("done"):
        out = client.completions.create(model=task.model, prompt=transcript,
                                        max_tokens=max_tokens)
        text = out.choices[0].text
        ws.send(json.dumps({"type": "step", "data": {action_field: text}}))
        result = _receive(ws)
        steps += 1
        total += float(result.get("reward") or 0.0)
        transcript += text + observed(result)
      ws.send(json.dumps({"type": "close"}))
    return {"reward": total, "correct": bool(result.get("done")), "info": {"steps": steps}}

  play.prepare, play.close = server.start, server.stop
  return play

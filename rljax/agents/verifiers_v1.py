"""verifiers v1 environments (``verifiers>=0.4``: tasksets, harness programs, runtimes) played
through the endpoint.

The library's v1 stack cannot share rljax's environment (``openai<3`` and ``mcp==2.0.0``
against rljax's ``openai`` 3 and openenv's ``mcp<2``), and it calls its model as an
OpenAI-compatible endpoint anyway: its harness is a program (a ``uv`` script) whose chat calls
the library relays to the episode's client. So a v1 environment is a rljax *harness*: the
library's environment runs in its own Python behind a small HTTP bridge
(``rljax/agents/verifiers_v1_bridge.py``, started before the harness workers fork and stopped
with the engine), and each episode's harness process asks the bridge to run one episode of the
taskset with the model at the episode's endpoint URL; the episode's reward is the reward the
library's rubric gives its trace::

  register_harness("reverse_text")(verifiers_v1_harness(
      taskset="reverse_text", python=".venv-verifiers/bin/python", port=8124,
      task_data=lambda p: {"prompt": p.prompt, "answer": p.answer}))

``task_data(problem)``: the taskset's ``TaskData`` fields of a rljax problem (``idx`` is added:
the problem's position is not known to a harness, so 0 unless given). ``env``: the library's
``SingleAgentEnvConfig`` fields (JSON-able; the agent defaults to the ``null`` harness in the
``subprocess`` runtime: no container, but ``uv`` on the bridge's ``PATH``). The calls reach
rljax's ``/v1/chat/completions`` (streamed), so the policy's tokenizer needs a chat template.
"""
from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request
from typing import Callable, Optional

from rljax.agents.harness import AgentTask
from rljax.agents.openenv_agent import OpenEnvServer
from rljax.errors import StartupError

BRIDGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verifiers_v1_bridge.py")


class BridgeError(RuntimeError):
  """The bridge could not run an episode (its message names why)."""


def bridge_command(python: str, taskset: str, port: int, env: Optional[dict] = None) -> list:
  """The bridge's command line, run by ``python`` (the verifiers environment's interpreter)."""
  return [python, BRIDGE, "--taskset", taskset, "--port", str(port),
          "--env", json.dumps(env or {})]


def free_port() -> int:
  """A TCP port free on this host now (the bridge's, when a harness names none)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def verifiers_v1_harness(*, taskset: str, python: str, task_data: Callable[[object], dict],
                         port: int = 0, env: Optional[dict] = None,
                         python_path: Optional[str] = None, timeout_s: float = 600.0):
  """A harness running the v1 ``taskset`` through the bridge (module docstring); register it with
  ``register_harness``. ``port``: the bridge's (0: a free one, chosen now, so that runs side by
  side do not collide); ``python_path``: directories the bridge imports tasksets from (an
  example environment not installed as a package)."""
  port = port or free_port()
  variables = dict(os.environ)
  # The harness program is a uv script: uv from the verifiers environment, if it holds one.
  variables["PATH"] = os.path.dirname(python) + os.pathsep + variables.get("PATH", "")
  if python_path:
    variables["PYTHONPATH"] = python_path
  server = OpenEnvServer(f"http://127.0.0.1:{port}", bridge_command(python, taskset, port, env),
                         env=variables, what=f"the verifiers v1 bridge ({taskset})")

  def play(task: AgentTask):
    body = json.dumps({"task": {"idx": 0, **task_data(task.problem)}, "base_url": task.base_url,
                       "api_key": task.api_key, "model": task.model}).encode()
    request = urllib.request.Request(f"{server.url}/run", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
      with urllib.request.urlopen(request, timeout=timeout_s) as r:
        out = json.loads(r.read())
    except urllib.error.HTTPError as e:
      raise BridgeError(f"the verifiers v1 bridge refused the episode: "
                        f"{e.read().decode(errors='replace')[:300]}") from None
    if out["errors"]:  # the library's own record of a failed rollout: not a zero reward
      raise BridgeError(f"the verifiers v1 episode failed: {'; '.join(out['errors'])[:300]}")
    return {"reward": out["reward"], "correct": out["ok"] and out["reward"] >= 1.0,
            "info": {"last_reply": out["last_reply"], "turns": out["turns"]}}

  def prepare():
    if not os.path.exists(python):
      raise StartupError(f"the verifiers v1 environment's Python {python} does not exist: "
                         "scripts/bootstrap.sh makes .venv-verifiers (verifiers 0.4 and uv)")
    server.start()

  play.prepare, play.close = prepare, server.stop
  return play

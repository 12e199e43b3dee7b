"""A verifiers v1 environment served over HTTP to rljax's harness: run by the Python of the
environment that holds ``verifiers>=0.4`` (its pins cannot share rljax's: ``openai<3``,
``mcp==2.0.0``), never imported by rljax itself (only the standard library at module level)::

  .venv-verifiers/bin/python rljax/agents/verifiers_v1_bridge.py --taskset reverse_text \\
      --port 8124 [--env '{"agent": {"max_turns": 3}}']

``GET /health``: 200 once the environment is loaded. ``POST /run`` with ``{"task": the
taskset's TaskData as a dict, "base_url", "api_key", "model"}`` runs ONE episode of the
library's single-agent environment (``SingleAgentEnv.run_episode``, its whole rollout: setup,
the harness program, the taskset's stops and rewards, finalize) with the model at ``base_url``
(rljax's per-episode endpoint), and answers ``{"reward", "ok", "errors", "last_reply",
"turns"}``: the reward of its one trace (the rubric's weighted sum as the library computes it).

The task is built as the library's own env server builds a wire task (``EnvServer._build_task``:
the taskset's declared ``TaskData`` type validated from the dict, wrapped in its ``Task`` with the
config's task subtree), so the bridge never calls the taskset's ``load()`` (its dataset download).
The agent runs the ``null`` harness (a chat loop, no tools of its own) in the ``subprocess``
runtime by default: no container, but the harness's chat program is a ``uv`` script, so ``uv``
must be on ``PATH`` (``pip install uv`` in that environment) and able to install the script's
dependencies. Episodes run concurrently on one event loop (the library is asyncio throughout).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_AGENT = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
KEY_VAR = "RLJAX_VF1_API_KEY"  # the library reads the API key from a named variable


def load(taskset: str, overrides: dict):
  """The library's environment for ``taskset`` (``SingleAgentEnvConfig``: the taskset, the agent
  ``DEFAULT_AGENT`` updated by ``overrides['agent']``, the rest of ``overrides`` as given)."""
  from verifiers.v1.envs.single_agent import SingleAgentEnvConfig
  from verifiers.v1.utils.loaders import load_environment
  agent = {**DEFAULT_AGENT, **overrides.get("agent", {})}
  config = SingleAgentEnvConfig.model_validate(
      {**overrides, "taskset": {"id": taskset, **overrides.get("taskset", {})}, "agent": agent})
  return load_environment(config)


def build_task(env, data: dict):
  """The taskset's task from its data dict, as the library's env server builds a wire task."""
  task_cls = type(env.taskset).task_type()
  return task_cls(task_cls.data_type().model_validate(data), env.config.taskset.task)


async def run_one(env, request: dict) -> dict:
  from verifiers.v1.clients import ModelContext
  from verifiers.v1.configs.client import EvalClientConfig
  os.environ[KEY_VAR] = request.get("api_key") or "rljax"
  ctx = ModelContext(client=EvalClientConfig(base_url=request["base_url"], api_key_var=KEY_VAR),
                     model=request["model"])
  episode = await env.run_episode(build_task(env, request["task"]), ctx)
  errors = [f"{e.type}: {e.message}" for e in episode.errors]
  for trace in episode.traces:
    errors += [f"{e.type}: {e.message}" for e in (trace.errors or [])]
  if len(episode.traces) != 1:
    errors.append(f"the episode ran {len(episode.traces)} agents; the bridge serves "
                  "single-agent environments")
  trace = episode.traces[0] if episode.traces else None
  return {"reward": float(trace.reward or 0.0) if trace is not None else 0.0,
          "ok": bool(episode.ok), "errors": errors,
          "last_reply": (trace.last_reply or "") if trace is not None else "",
          "turns": int(trace.num_turns) if trace is not None else 0}


class Server(ThreadingHTTPServer):
  daemon_threads = True
  # The listen backlog: socketserver's default of 5 reset connections (ConnectionResetError in
  # two harnesses, a failed episode each) when a batch's 16 harnesses connected at once on a
  # loaded machine (configs/tasks/verifiers.py, step 6), as it did at rljax's endpoint server.
  request_queue_size = 1024


def serve(env, port: int) -> None:
  loop = asyncio.new_event_loop()
  threading.Thread(target=loop.run_forever, daemon=True).start()

  class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # one line per episode would flood the trainer's stderr
      pass

    def _send(self, status: int, body: dict) -> None:
      data = json.dumps(body).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def do_GET(self):
      self._send(200, {"ok": True}) if self.path == "/health" else self._send(404, {})

    def do_POST(self):
      if self.path != "/run":
        return self._send(404, {"error": f"no route {self.path}"})
      try:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        result = asyncio.run_coroutine_threadsafe(run_one(env, request), loop).result()
      except Exception as e:  # noqa: BLE001 - the harness reports it as the episode's failure
        return self._send(500, {"error": f"{type(e).__name__}: {e}"})
      self._send(200, result)

  Server(("127.0.0.1", port), Handler).serve_forever()


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--taskset", required=True, help="the taskset's id (an importable package)")
  ap.add_argument("--port", type=int, required=True)
  ap.add_argument("--env", default="{}", help="SingleAgentEnvConfig fields as JSON")
  args = ap.parse_args(argv)
  env = load(args.taskset, json.loads(args.env))  # a failure here reaches the starter's stderr
  # Then stderr goes nowhere: the starter reads it only if the start fails, and a full pipe
  # would block the library's logging mid-episode. An episode's errors travel in its answer.
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 2)
  serve(env, args.port)


if __name__ == "__main__":
  main()

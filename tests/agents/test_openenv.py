"""An OpenEnv environment end to end: the ``openenv`` package's own example environment (the
echo environment ``openenv init`` scaffolds), served by the package in its own environment
(``.venv-openenv``, made by scripts/bootstrap.sh), played through the endpoint by
``openenv_harness``: each step's action is the policy's answer, and the episode's reward is what
the server's echo environment pays for it, ``min(0.1 * len(message), 1)`` per step, recomputed
here from the recorded answers."""
import os
import re
import socket
import subprocess
import sys

import jax
import pytest

from rljax.agents import driver as driver_lib
from rljax.agents import harness as harness_lib
from rljax.agents.harness import register_harness
from rljax.agents.openenv_agent import openenv_harness
from rljax.data.tasks import Problem
from rljax.envs.episodes import EnvSettings
from rljax.models import transformer
from rljax.rollout.engines import JaxEngine
from tests.agents.test_endpoint import SP8
from tests.envs.test_driver import TOK, tiny_model_config
from tests.train import tiny

VENV = os.path.join(tiny.ROOT, ".venv-openenv", "bin")
STEPS = 2


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory):
  """The scaffolded example environment, allowed 8 concurrent sessions; (directory, port)."""
  assert os.path.exists(os.path.join(VENV, "openenv")), "run scripts/bootstrap.sh"
  root = tmp_path_factory.mktemp("openenv")
  subprocess.run([os.path.join(VENV, "openenv"), "init", "echo_env", "-o", str(root)],
                 check=True, capture_output=True)
  app = root / "echo_env" / "server" / "app.py"
  app.write_text(re.sub(r"max_concurrent_envs=\d+", "max_concurrent_envs=8", app.read_text()))
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return str(root), port


def test_an_openenv_example_environment_plays_through_the_endpoint(echo_env):
  root, port = echo_env
  name = f"t_openenv_{port}"
  register_harness(name)(openenv_harness(
      url=f"http://127.0.0.1:{port}", cwd=root, action_field="message",
      observation_field="echoed_message", max_steps=STEPS, max_tokens=6, render=str.lower,
      command=[os.path.join(VENV, "python"), "-m", "uvicorn", "echo_env.server.app:app",
               "--host", "127.0.0.1", "--port", str(port)]))
  cfg = tiny_model_config()
  base = JaxEngine(cfg)
  base.load_weights(jax.tree.map(lambda x: 4.0 * x, transformer.init_params(cfg, seed=0)), 0)
  settings = EnvSettings(name=name, engine="endpoint", max_tokens=64, timeout_s=120.0,
                         harness_workers=4, max_prompt_tokens=100)
  engine = driver_lib.EndpointEngine(base, settings, TOK, prompt_bucket=16)
  try:
    result = engine.episodes([Problem("say: ", "0"), Problem("echo: ", "0")],
                             jax.random.PRNGKey(0), SP8, 2)
  finally:
    engine.close()
    harness_lib.close_harness_pool()
  assert result.counts["env/errors"] == 0 and result.counts["env/timeouts"] == 0, result.failures[:1]
  for ep, calls in zip(result.episodes, result.calls):
    assert len(calls) == STEPS and ep.infos[0]["steps"] == STEPS
    paid = sum(min(0.1 * len(TOK.decode(c.completion_ids)), 1.0) for c in calls)
    assert abs(ep.reward - paid) < 1e-6
  with pytest.raises(OSError):  # the engine stopped the server it started
    socket.create_connection(("127.0.0.1", port), timeout=2)


# A server answering /health, and a starter that exits without stopping it (as a preempted run
# did: its engine, which stops the server, is not closed on that path).
_HEALTH = ("import http.server, sys\n"
           "class H(http.server.BaseHTTPRequestHandler):\n"
           "  def do_GET(self):\n    self.send_response(200); self.end_headers()\n"
           "  def log_message(self, *a):\n    pass\n"
           "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
_STARTER = ("import sys\nfrom rljax.agents.openenv_agent import OpenEnvServer\n"
            "port = sys.argv[1]\n"
            "s = OpenEnvServer('http://127.0.0.1:' + port, [sys.executable, '-c', sys.argv[2], port])\n"
            "s.start()\nprint(s.process.pid, flush=True)\nraise SystemExit(3)\n")


def test_a_started_server_is_stopped_when_its_starter_exits_without_closing(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  done = subprocess.run([sys.executable, "-c", _STARTER, str(port), _HEALTH], cwd=tiny.ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 3, done.stderr[-500:]
  pid = int(done.stdout.split()[0])
  try:
    os.kill(pid, 0)
    alive = not open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"
  except ProcessLookupError:
    alive = False
  if alive:
    os.kill(pid, 9)
  assert not alive


# A server that writes 256 KiB to stderr before it listens and as much again at every request:
# four times a pipe's 64 KiB, so it blocks unless its starter keeps reading.
_NOISY = ("import http.server, sys\n"
          "sys.stderr.write('x' * 262144 + '\\n'); sys.stderr.flush()\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "  def do_GET(self):\n"
          "    sys.stderr.write('y' * 262144 + '\\n'); sys.stderr.flush()\n"
          "    self.send_response(200); self.end_headers()\n"
          "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_server_that_logs_a_lot_to_stderr_keeps_serving(monkeypatch):
  from rljax.agents import openenv_agent
  monkeypatch.setattr(openenv_agent, "START_S", 20.0)  # a blocked server fails in 20 s, not 120
  port = _free_port()
  server = openenv_agent.OpenEnvServer(f"http://127.0.0.1:{port}",
                                       [sys.executable, "-c", _NOISY, str(port)])
  try:
    server.start()
    assert all(server.healthy() for _ in range(4))
  finally:
    server.stop()


def test_a_server_that_exits_at_start_names_its_last_stderr_line():
  from rljax.agents import openenv_agent
  from rljax.errors import StartupError
  command = [sys.executable, "-c", "import sys; print('first', file=sys.stderr); "
             "print('no module named echo_env', file=sys.stderr); print(file=sys.stderr); "
             "sys.exit(7)"]
  with pytest.raises(StartupError, match=r"exited 7: no module named echo_env$"):
    openenv_agent.OpenEnvServer(f"http://127.0.0.1:{_free_port()}", command).start()

"""Markers of the parallel tests (``slow``: runs a multi-device / multi-process subprocess)."""
import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: starts subprocesses with simulated devices (runs by default; "
      "deselect with -m 'not slow')")


def device_env(num_devices: int) -> dict:
  """Environment of a subprocess with ``num_devices`` simulated CPU devices."""
  env = dict(os.environ)
  # The session's other XLA flags are kept (tests/conftest.py: cheap CPU codegen).
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={num_devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  for key in list(env):  # never let a surrounding cluster job leak into the children
    if key.startswith("SLURM_") or key in ("JAX_COORDINATOR_ADDRESS", "OMPI_MCA_orte_hnp_uri"):
      del env[key]
  return env


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def run_script(name: str, *args, num_devices: int = 8, timeout: float = 120,
               env: dict | None = None) -> str:
  proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, name), *map(str, args)],
                        env={**device_env(num_devices), **(env or {})}, cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)
  if proc.returncode:
    raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stdout}\n"
                         f"{proc.stderr[-4000:]}")
  return proc.stdout

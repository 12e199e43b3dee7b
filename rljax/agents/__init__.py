"""Agents the way the field builds them (docs/agents.md): any agent harness trained through an
OpenAI-compatible endpoint served by the run's engine (``env.engine='endpoint'``), with the exact
token ids of every call recorded; a sandbox for untrusted code, the ``python`` tool and unit-test
rewards of code tasks.

Every module of the package is imported here, so a harness, tool or reward function registers
itself by existing (``rljax.train.build`` imports the package).
"""
import importlib as _importlib
import pkgutil as _pkgutil

# The launcher is a standalone script run in the sandbox's own interpreter.
_NOT_SCANNED = ("sandbox_launch",)
for _module in _pkgutil.iter_modules(__path__):
  if _module.name not in _NOT_SCANNED:
    _importlib.import_module(f"{__name__}.{_module.name}")

from rljax.agents.harness import AgentTask, command_harness, register_harness  # noqa: E402
from rljax.agents.openenv_agent import openenv_harness  # noqa: E402

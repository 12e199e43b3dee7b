"""Multi-turn environments and tools (``env.*`` keys; docs/multiturn.md).

``register_env`` / ``register_tool`` add one; ``rljax.envs.episodes`` is the turn-synchronous
rollout driver the train loop uses when ``env.name`` is set. Every module of the package but the
driver is imported here, so an environment or tool registers itself by existing.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from rljax.envs.base import (ENVS, Environment, StepResult, env_names, get_env_class, make_env,
                             register_env, unregister_env)
from rljax.envs.tools import (TOOLS, ToolCall, ToolError, parse_tool_calls, register_tool,
                              render_call, render_calls, render_result, run_tool, tool_messages,
                              tool_names, unregister_tool)
from rljax.envs.tool_env import ToolEnv

# The drivers and their engines (episodes, async_turns, drivers) import JAX: their users import
# them (rljax.train.build imports engines, which registers the multi-turn engines).
_NOT_SCANNED = ("episodes", "async_turns", "drivers")
for _module in _pkgutil.iter_modules(__path__):
  if _module.name not in _NOT_SCANNED:
    _importlib.import_module(f"{__name__}.{_module.name}")

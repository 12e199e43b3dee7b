"""Multi-turn environments and tools (``env.*`` keys; docs/multiturn.md).

``register_env`` / ``register_tool`` add one; ``rljax.envs.episodes`` is the turn-synchronous
rollout driver the train loop uses when ``env.name`` is set. Every module of this package is
imported the first time ``ENVS`` or ``TOOLS`` is read (``rljax.registries``), so an environment or
tool registers itself by existing.
"""
from rljax.envs.base import (ENVS, Environment, StepResult, env_names, get_env_class, make_env,
                             register_env, unregister_env)
from rljax.envs.tools import (TOOLS, ToolCall, ToolError, parse_tool_calls, register_tool,
                              render_call, render_calls, render_result, run_tool, tool_messages,
                              tool_names, unregister_tool)
from rljax.envs.tool_env import ToolEnv

"""Agents the way the field builds them (docs/agents.md): any agent harness trained through an
OpenAI-compatible endpoint served by the run's engine (``env.engine='endpoint'``), with the exact
token ids of every call recorded; a sandbox for untrusted code, the ``python`` tool and unit-test
rewards of code tasks.

Every module of the package is imported the first time the registries it fills are read (the
environments, episode engines, tools and reward functions of ``rljax.registries``), so a harness,
tool or reward function registers itself by existing. (``sandbox_launch`` is imported then too:
it runs nothing on import; the sandbox runs it as a script in its own interpreter.)
"""
from rljax.agents.harness import AgentTask, command_harness, register_harness
from rljax.agents.openenv_agent import openenv_harness

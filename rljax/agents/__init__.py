"""Agents the way the field builds them (docs/agents.md): any agent harness trained through an
OpenAI-compatible endpoint served by the run's engine (``env.engine='endpoint'``), with the exact
token ids of every call recorded; a sandbox for untrusted code, the ``python`` tool and unit-test
rewards of code tasks.

Every module of the package is imported the first time the registries it fills are read (the
environments, episode engines, tools and reward functions of ``rljax.registries``), so a harness,
tool or reward function registers itself by existing. (``sandbox_launch`` and
``verifiers_v1_bridge`` are imported then too: they run nothing on import and import only the
standard library at module level; the sandbox, and the verifiers v1 harness, run them as scripts
in their own interpreters.)
"""
from rljax.agents.harness import AgentTask, command_harness, register_harness
from rljax.agents.openenv_agent import openenv_harness
from rljax.agents.verifiers_v1 import verifiers_v1_harness

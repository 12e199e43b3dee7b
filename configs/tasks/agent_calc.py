"""The calculator agent trained through the OpenAI-compatible endpoint: ``calc_agent``
(rljax/agents/calc_agent.py), ordinary ``openai`` client code, plays each episode against the
run's own engine, GRPO trains on the exact ids it was served.

  python -m rljax train --config configs/tasks/agent_calc.py

The task, cold start and algorithm are ``configs/tasks/tool_calc.py``'s (its in-process environment is
the baseline: the agent plays the same protocol); only who plays the episode changes. Measured
figures: docs/agents.md. ``--config.train.steps=2`` for a smoke run.
"""
import rljax.agents  # noqa: F401  (registers the harnesses)
from rljax.config.loader import based_on


def get_config():
  c = based_on("tasks/tool_calc.py")
  c.env.name = "calc_agent"
  c.env.engine = "endpoint"
  # A whole episode, the first batches' compilations of the engine's lanes included (minutes on
  # a loaded 2-core CPU; an episode itself takes well under a second).
  c.env.timeout_s = 1200.0
  # The first prompt's bound ('123*45=' with BOS is 8 tokens): it sizes the engine's cache store
  # (this + env.max_tokens positions per episode).
  c.data.max_prompt_tokens = 16
  c.train.run_dir = "runs/agent_calc"
  return c

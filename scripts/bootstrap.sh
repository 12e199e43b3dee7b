#!/usr/bin/env bash
# Creates .venv on first use and installs rljax with its test extras, the experiment trackers and
# the task/environment libraries, peft (their tests run too), pinned by constraints.txt; and
# .venv-openenv, the openenv package for the OpenEnv example server the agent tests start, and
# .venv-verifiers, verifiers v1 for configs/tasks/verifiers.py and the v1 bridge's tests (their
# pins share neither .venv nor each other: openenv's mcp<2, verifiers' openai<3 and mcp==2.0.0).
# Re-running is cheap: the install is skipped while setup.py and constraints.txt are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.rljax-installed
want=$(cat setup.py constraints.txt | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[test,wandb,mlflow,reasoning_gym,peft,agents,openenv]"
  if [ ! -x .venv-openenv/bin/python ]; then
    python3 -m venv .venv-openenv
  fi
  .venv-openenv/bin/python -m pip install -q -c constraints.txt "openenv==$(sed -n 's/^openenv==//p' constraints.txt)"
  if [ ! -x .venv-verifiers/bin/python ]; then
    python3 -m venv .venv-verifiers
  fi
  # verifiers v1 (its own pins: openai<3, mcp==2.0.0) and uv, which runs its harness programs.
  .venv-verifiers/bin/python -m pip install -q "verifiers==$(sed -n 's/^# verifiers-v1==//p' constraints.txt)" \
      "uv==$(sed -n 's/^# uv==//p' constraints.txt)"
  echo "$want" > "$stamp"
fi

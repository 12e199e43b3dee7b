#!/usr/bin/env bash
# The main job: creates the virtualenv if needed, then trains DAPO on the embedded arithmetic task
# from an SFT cold start (configs/jobs/main.py). Extra arguments are config overrides, e.g.
#   bash scripts/main.sh --config.train.steps=3
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m rljax train --config configs/jobs/main.py "$@"

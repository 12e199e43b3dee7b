#!/usr/bin/env bash
# The test suite: creates the virtualenv if needed, then runs every test (slow ones included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -x -q tests "$@"

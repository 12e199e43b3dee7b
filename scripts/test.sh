#!/usr/bin/env bash
# The test suite: creates the virtualenv if needed, then runs every test (slow ones included),
# in two worker processes (most of the suite is single-threaded compilation; one file per
# worker, so module fixtures are built once; tests/conftest.py starts the longest files first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# --no-loadscope-reorder keeps that order: xdist would re-sort the files by their number of tests.
exec .venv/bin/python -m pytest -x -q -n 2 --dist loadfile --no-loadscope-reorder tests "$@"

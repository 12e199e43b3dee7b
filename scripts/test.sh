#!/usr/bin/env bash
# The test suite: creates the virtualenv if needed, then runs every test (slow ones included),
# in two worker processes (most of the suite is single-threaded compilation; one file per
# worker, so module fixtures are built once; tests/conftest.py starts the longest files first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# --no-loadscope-reorder keeps that order: xdist would re-sort the files by their number of tests.
# --max-worker-restart=0: a worker that crashes (a segfault) ends the run naming its test; with a
# replacement worker, --dist loadfile can wait forever for the files the crashed one held.
# faulthandler_timeout: a test still running after 20 minutes prints every thread's stack.
exec .venv/bin/python -m pytest -x -q -n 2 --dist loadfile --no-loadscope-reorder \
  --max-worker-restart=0 -o faulthandler_timeout=1200 tests "$@"

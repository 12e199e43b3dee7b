"""``benchmarks/accelerator.py --smoke``: the accelerator benchmark runs end to end on the CPU at a
tiny shape and prints its table (what a borrowed GPU runs at full size, scripts/device_check.sh)."""
import os
import subprocess
import sys

import pytest

from tests import xla_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table_rows(stdout: str) -> list[dict]:
  """The markdown table's rows as ``{column: cell}``."""
  lines = [[cell.strip() for cell in line.strip().strip("|").split("|")]
           for line in stdout.splitlines() if line.startswith("| ")]
  header, body = lines[0], lines[2:]  # lines[1] is the '---' separator
  return [dict(zip(header, cells)) for cells in body]


def number(cell: str) -> float:
  return float(cell.split()[0].rstrip("%").replace(",", ""))


@pytest.mark.slow
def test_accelerator_benchmark_smoke():
  run = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "accelerator.py"), "--smoke"],
      capture_output=True, text=True, timeout=180, cwd=ROOT,
      env=dict(xla_cache.env_without(), JAX_PLATFORMS="cpu"))  # it times compilations
  assert run.returncode == 0, run.stderr[-3000:]
  rows = table_rows(run.stdout)
  assert [(r["measure"], r["shape"]) for r in rows] == [("update", "2x128"), ("sample", "8x16+16")]
  for row in rows:
    for column in ("ms", "compile s", "throughput", "% roofline", "XLA GiB"):
      assert number(row[column]) > 0, (column, row)
  assert "torch peer skipped: --smoke" in run.stdout
  assert "# MFU = 3 (2 N R S" in run.stdout  # the formula is printed with the figures

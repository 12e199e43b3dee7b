"""Benchmarks run end to end on the CPU at a tiny shape (``--smoke``) and print their tables:
``benchmarks/accelerator.py`` (what a borrowed GPU runs at full size, scripts/device_check.sh) and
``benchmarks/moe_dispatch.py``."""
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


def test_moe_dispatch_benchmark_smoke():
  run = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "moe_dispatch.py"), "--smoke"],
      capture_output=True, text=True, timeout=180, cwd=ROOT, env=dict(os.environ,
                                                                   JAX_PLATFORMS="cpu"))
  assert run.returncode == 0, run.stderr[-3000:]
  rows = {r["dispatch"]: r for r in table_rows(run.stdout)}
  assert list(rows) == ["dense", "sparse", "ragged_dot"]
  # The smoke shape: T=32 tokens, D=16, F=8, E=8, k=2. Forward + backward of the three expert
  # matmuls is 3 x 3 x 2 T D F multiply-adds per (token, expert) pair computed.
  expert_mflop = 18 * 32 * 16 * 8 / 1e6
  assert number(rows["dense"]["MFLOP"]) >= 8 * expert_mflop  # every expert, every token
  assert 2 * expert_mflop <= number(rows["sparse"]["MFLOP"]) < number(rows["dense"]["MFLOP"])
  for name in ("sparse", "ragged_dot"):
    assert number(rows[name]["max rel. diff"]) < 1e-5, rows[name]
    assert number(rows[name]["ms (median)"]) > 0

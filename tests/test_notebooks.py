"""The notebooks run top to bottom."""
import os
import runpy

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", ["quickstart.py"])
def test_notebook_runs(name, monkeypatch):
  monkeypatch.chdir(ROOT)
  namespace = runpy.run_path(os.path.join(ROOT, "notebooks", name), run_name="__main__")
  assert int(namespace["state"].step) == 1

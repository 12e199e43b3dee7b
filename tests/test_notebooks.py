"""Every notebook in notebooks/ runs top to bottom in a Jupyter kernel (each checks what it claims
with its own asserts: a finite update, clipped tokens, transformers parity, ...). The kernel sees
RLJAX_NOTEBOOK_SMOKE=1: a notebook whose default trains for minutes (multiturn_guess) shrinks its
model and steps to seconds when it is set."""
import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_every_notebook_is_listed():
  assert NOTEBOOKS == ["custom_component.ipynb", "hf_checkpoint.ipynb", "inspect_rollout.ipynb",
                       "multiturn_guess.ipynb", "quickstart.ipynb", "visual.ipynb"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch):
  path = os.path.join(ROOT, "notebooks", name)
  notebook = nbformat.read(path, as_version=4)
  monkeypatch.setenv("RLJAX_NOTEBOOK_SMOKE", "1")  # the kernel inherits it
  env_path = os.environ.get("PYTHONPATH", "")
  os.environ["PYTHONPATH"] = ROOT + (os.pathsep + env_path if env_path else "")
  try:
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
  finally:
    os.environ["PYTHONPATH"] = env_path
  errors = [o for cell in notebook.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors

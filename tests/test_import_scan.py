"""Imports run down the layers (docs: DESIGN's models < rollout < rewards/data/parallel < algos <
transforms/envs < train < api/cli): ``scripts/import_scan.py`` finds no circle, no import
back up, and function-local imports only where they keep something off the import path."""
import importlib.util
import os
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Where a function-local import is the point: the CLI (each command imports what it runs, after
# setting XLA flags) and the package's face (``import rljax`` stays cheap).
LOCAL_IMPORT_MODULES = ("rljax.cli", "rljax")
# Heavy or optional dependencies kept off the import path, each with why.
LOCAL_IMPORT_DEPENDENCIES = {
    "torch": "the optional [hf] extra: conversion checks against transformers",
    "transformers": "seconds to import: HF tokenizers and conversion checks only",
    "datasets": "the optional [hf] extra: hf: data sources only",
    "PIL": "the optional [vision] extra (Pillow): decoding and processing images only",
    "tensorboardX": "heavy: the metrics sink of the main process only",
    "matplotlib": "sweep plots: the backend is chosen before pyplot is first imported",
    "matplotlib.pyplot": "sweep plots, after the backend is chosen",
    "matplotlib.backends.backend_agg": "run curves, drawn at a run's end (~1 s of start-up)",
    "matplotlib.figure": "run curves, drawn at a run's end (~1 s of start-up)",
    "math_verify": "sympy-heavy: only when that verifier is used",
    "scipy": "one statistic of the sweep reports",
    "openai": "the optional [agents] extra: the demo harnesses' client, in harness processes",
    "websockets.sync.client": "the optional [openenv] extra: OpenEnv harnesses only",
    "jax.experimental.pallas.ops.tpu.splash_attention": "the TPU kernels (Mosaic), where they run",
    "jax._src.clusters": "cluster detection through JAX's private API, guarded",
    "reasoning_gym": "the optional [reasoning_gym] extra: only a reasoning_gym: data source",
    "wandb": "the optional [wandb] extra: only a run whose train.loggers names it",
    "mlflow.tracking": "the optional [mlflow] extra: only a run whose train.loggers names it",
    "mlflow.entities": "the optional [mlflow] extra: only a run whose train.loggers names it",
    **{name: "verifiers v1: only in the bridge process, run by .venv-verifiers' Python" for name in (
        "verifiers.v1.envs.single_agent", "verifiers.v1.utils.loaders", "verifiers.v1.clients",
        "verifiers.v1.configs.client")},
}


def _scan():
  spec = importlib.util.spec_from_file_location("import_scan",
                                                os.path.join(ROOT, "scripts", "import_scan.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_no_circles_and_no_imports_back_up():
  result = _scan().scan(ROOT)
  assert result["circles"] == [], result["circles"]
  assert result["upward"] == [], result["upward"]


def test_function_local_imports_only_where_they_keep_a_dependency_off_the_path():
  result = _scan().scan(ROOT)
  stray = [f"{e['module']}:{e['line']} {e['imports']}" for e in result["local"]
           if e["module"] not in LOCAL_IMPORT_MODULES
           and e["imports"] not in LOCAL_IMPORT_DEPENDENCIES]
  assert not stray, "\n".join(stray)


def test_the_scan_finds_a_circle_an_upward_and_a_local_import(tmp_path):
  """The scan itself, on a hand-made package: models imports train (up, and a circle with
  train's import of models), and algos imports numpy inside a function."""
  package = tmp_path / "rljax"
  for folder in ("models", "train", "algos"):
    (package / folder).mkdir(parents=True)
    (package / folder / "__init__.py").write_text("")
  (package / "__init__.py").write_text("")
  (package / "models" / "core.py").write_text("from rljax.train import loop\n")
  (package / "train" / "loop.py").write_text("from rljax.models import core\n")
  (package / "algos" / "fn.py").write_text(textwrap.dedent("""\
      def f():
        import numpy
        return numpy
      """))
  result = _scan().scan(str(tmp_path))
  assert result["circles"] == [["rljax.models.core", "rljax.train.loop"]]
  assert [(u["module"], u["imports"]) for u in result["upward"]] == [
      ("rljax.models.core", "rljax.train.loop")]
  assert [(e["module"], e["imports"]) for e in result["local"]] == [("rljax.algos.fn", "numpy")]


def test_reading_the_defaults_and_checking_registers_nothing():
  """``rljax/config/`` sits at the bottom: reading the key table and importing the checks
  imports only the config package, the registries (which fill themselves when read, by module
  path) and the errors: no environment, task or component registers itself as a side effect."""
  import subprocess
  import sys
  code = ("import sys, rljax.config.table, rljax.config.checks; "
          "print(sorted(m for m in sys.modules if m.startswith('rljax')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": ROOT}).stdout.strip()
  loaded = eval(out)
  assert "rljax.config.table" in loaded, loaded
  assert all(m in ("rljax", "rljax.errors", "rljax.registries") or m.startswith("rljax.config.")
             or m == "rljax.config" for m in loaded), loaded

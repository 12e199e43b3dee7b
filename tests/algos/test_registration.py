"""Registration cannot be forgotten: every module of ``rljax`` that registers a component, a
transform, an environment or an engine is imported by the config checks, which load every registry
(package scans, no list by hand)."""
import os
import re
import subprocess
import sys

import rljax

ROOT = os.path.dirname(rljax.__file__)
REGISTERS = re.compile(r"^@register_\w+\(|^@\w+\.register\(", re.M)


def _registering_modules():
  found = []
  for folder, _, files in os.walk(ROOT):
    for name in files:
      path = os.path.join(folder, name)
      if name.endswith(".py") and REGISTERS.search(open(path, encoding="utf-8").read()):
        rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3]
        found.append(rel.replace(os.sep, "."))
  return sorted(found)


def test_every_registering_module_is_imported_by_its_package():
  modules = _registering_modules()
  assert {"rljax.algos.losses", "rljax.transforms.kl_coef", "rljax.rewards.checkers"} <= set(
      modules)
  # A fresh interpreter: what the config checks import (they load every registry the key
  # declarations name), nothing a test did.
  code = ("import sys, rljax.config.checks; "
          f"print([m for m in {modules!r} if m not in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(ROOT))
  assert out.stdout.strip() == "[]", f"registered only if someone imports them: {out.stdout}"


def test_a_new_module_in_a_registry_package_registers_itself(tmp_path):
  """A module dropped into rljax/transforms (no list edited) is found by the package scan."""
  package = tmp_path / "pkg"
  (package / "rljax").mkdir(parents=True)
  for sub in ("algos", "transforms", "rewards"):
    os.symlink(os.path.join(ROOT, sub), package / "rljax" / sub)
  # A copy of the transforms package with one more module, in a private tree.
  os.unlink(package / "rljax" / "transforms")
  (package / "rljax" / "transforms").mkdir()
  for name in os.listdir(os.path.join(ROOT, "transforms")):
    if name.endswith(".py"):
      os.symlink(os.path.join(ROOT, "transforms", name), package / "rljax" / "transforms" / name)
  (package / "rljax" / "transforms" / "zz_new.py").write_text(
      "from rljax.transforms.base import register_transform\n"
      "@register_transform('zz_new', order=1000, reads=())\n"
      "def make(algo, hparams):\n  return None\n")
  for name in os.listdir(ROOT):
    if name not in ("algos", "transforms", "rewards", "__pycache__"):
      os.symlink(os.path.join(ROOT, name), package / "rljax" / name)
  code = "import rljax.transforms as t; print('zz_new' in t.TRANSFORMS.names())"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=str(package), env=dict(os.environ, PYTHONPATH=str(package)))
  assert out.stdout.strip() == "True", out.stderr[-2000:]

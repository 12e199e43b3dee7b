"""Registration cannot be forgotten: every module of ``rljax`` that registers a piece (a
component, a transform, an environment, an engine, a data source, ...) is imported when the
registries are read, each registry filling itself from the modules it declares (package scans, no
list by hand), and nothing imports a module for its side effect."""
import os
import re
import subprocess
import sys

import rljax
from rljax import registries
from rljax.config.table import KEY_BY_NAME

ROOT = os.path.dirname(rljax.__file__)
REGISTERS = re.compile(r"^@?[\w.]*register_\w+\(|^@\w+\.register\(", re.M)


def _registering_modules():
  found = []
  for folder, _, files in os.walk(ROOT):
    for name in files:
      path = os.path.join(folder, name)
      if name.endswith(".py") and REGISTERS.search(open(path, encoding="utf-8").read()):
        rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3]
        found.append(rel.replace(os.sep, "."))
  return sorted(found)


def test_every_registering_module_fills_a_registry_when_it_is_read():
  modules = _registering_modules()
  assert {"rljax.algos.losses", "rljax.transforms.kl_coef", "rljax.rewards.checkers",
          "rljax.envs.drivers", "rljax.data.datasets", "rljax.runs.trackers",
          "rljax.models.families.llama"} <= set(modules)
  # A fresh interpreter that reads every registry and imports nothing else of rljax.
  code = ("import sys, rljax.registries as r; [reg.names() for reg in r.FAMILIES.values()]; "
          f"print([m for m in {modules!r} if m not in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(ROOT))
  assert out.stdout.strip() == "[]", f"registered only if someone imports them: {out.stdout}"


# A new module per plug-in kind, each dropped into the package its registry scans: (package,
# module text, registry, name).
NEW_MODULES = (
    ("transforms", "from rljax.transforms.base import register_transform\n"
     "@register_transform('zz_new', order=1000, reads=())\n"
     "def make(algo, hparams):\n  return None\n", "TRANSFORMS", "zz_new"),
    ("data", "from rljax.data.sources import Rows, register_data_source\n"
     "@register_data_source('zz_new')\ndef zz(arg, settings):\n  return Rows([])\n",
     "DATA_SOURCES", "zz_new"),
    ("runs", "from rljax.runs.trackers import register_logger\n"
     "@register_logger('zz_new')\ndef zz(config, start):\n  return None\n", "LOGGERS",
     "zz_new"),
    ("rewards", "from rljax.rewards.sources import register_reward_source\n"
     "@register_reward_source('zz_new')\ndef zz(config, tok, cfg, mesh):\n  return None\n",
     "REWARD_SOURCES", "zz_new"),
    ("envs", "from rljax.envs.base import Environment, register_env\n"
     "@register_env('zz_new')\nclass Zz(Environment):\n  reset = step = None\n", "ENVS",
     "zz_new"),
    ("rollout", "from rljax.rollout.engines import register_engine\n"
     "@register_engine('zz_new')\ndef zz(config, model_cfg, placement):\n  return None\n",
     "ROLLOUT_ENGINES", "zz_new"),
)


def test_a_new_module_in_a_registry_package_registers_itself(tmp_path):
  """A module dropped into the package a registry scans (a transform, a data source, a logger, a
  reward source, an environment, a rollout engine: no list edited, nothing else touched) is
  registered when the registry is first read."""
  package = tmp_path / "pkg" / "rljax"
  package.mkdir(parents=True)
  changed = {sub for sub, *_ in NEW_MODULES}
  for name in os.listdir(ROOT):
    if name not in changed | {"__pycache__"}:
      os.symlink(os.path.join(ROOT, name), package / name)
  for sub, text, _, _ in NEW_MODULES:  # a private copy of the package with one more module
    (package / sub).mkdir()
    for name in os.listdir(os.path.join(ROOT, sub)):
      if name.endswith(".py"):
        os.symlink(os.path.join(ROOT, sub, name), package / sub / name)
    (package / sub / "zz_new.py").write_text(text)
  code = ("import rljax.registries as r; "
          f"print([n in getattr(r, reg).names() for _, _, reg, n in {NEW_MODULES!r}])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=str(package.parent),
                       env=dict(os.environ, PYTHONPATH=str(package.parent)))
  assert out.stdout.strip() == str([True] * len(NEW_MODULES)), out.stderr[-2000:]


# ``import rljax.x  # noqa: F401`` or ``from rljax.x import y as _y  # noqa: F401``: an import
# kept only for what importing it does (e.g. filling a registry before it is read).
SIDE_EFFECT = re.compile(r"^\s*(import rljax\S*|from rljax\S* import \w+ as _\w+)\s+# noqa: F401")


def test_nothing_imports_a_module_for_its_side_effect():
  kept = []
  for folder, _, files in os.walk(ROOT):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
          if SIDE_EFFECT.match(line):
            kept.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
  assert not kept, kept


def test_every_key_a_registration_reads_is_declared():
  """``reads`` names config keys by their dotted names, each declared in the key table."""
  declared = {(kind, name, key) for kind, reg in registries.FAMILIES.items()
              for name in reg.names() for key in reg.meta(name)["reads"]}
  assert declared and {key for _, _, key in declared} - set(KEY_BY_NAME) == set()

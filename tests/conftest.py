"""Shared fixtures: tiny random Hugging Face models built once per session on CPU torch."""
import collections
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tests import xla_cache  # noqa: E402

xla_cache.start_session()  # before JAX is imported: JAX reads the directory at its import
# Tiny test programs spend most of their time in XLA:CPU's LLVM backend; its cheap settings (the
# same HLO, codegen only; tests/algos/helpers.py FAST_COMPILE) compile a tiny PPO run's programs
# in ~3/4 of the time. Numbers move by float rounding (~1e-7 relative), the same in every process
# of the session: the subprocesses inherit the flags (tests/parallel/conftest.py keeps them).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests import hf_models  # noqa: E402

# JAX starts here, with the session's devices (one CPU device unless XLA_FLAGS say otherwise):
# `rljax train` run in-process then keeps them (rljax.parallel.mesh.start_cpu_devices splits the
# CPU only before JAX starts), so no test changes the devices of the files after it in a worker.
jax.devices()


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
  """{'llama', 'qwen2', 'llama_gqa_tied', 'llama3_rope'} -> directory of a saved tiny model."""
  root = tmp_path_factory.mktemp("hf")
  return {name: hf_models.build(name, str(root / name)) for name in hf_models.ARCHS}


@pytest.fixture(scope="session")
def left_padded_batch():
  """Token ids and mask [4, 12] of prompts with lengths 12, 7, 3, 9, left-padded."""
  return hf_models.left_padded([12, 7, 3, 9], width=12, vocab=hf_models.VOCAB, seed=0)


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: compiles several train steps or spawns processes "
                          "(runs by default, CI included; deselect with -m 'not slow')")


def pytest_unconfigure(config):
  xla_cache.end_session()


DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")
SECONDS_PER_SLOW_TEST = 10.0  # the estimate for a file not in DURATIONS yet


def pytest_collection_modifyitems(config, items):
  """The longest files run first: the seconds ``DURATIONS`` records (scripts/test_durations.py),
  else ``SECONDS_PER_SLOW_TEST`` per slow test. Under ``pytest -n 2 --dist loadfile``
  (scripts/test.sh) each file goes to one worker: a long file left for the end runs alone while
  the other core idles (a file with long unmarked tests did, for ~4 minutes). The sort is stable,
  so tests keep their order within a file. xdist keeps this order only with
  ``--no-loadscope-reorder`` (scripts/test.sh): by default it re-sorts the files by their number
  of tests, which started the long subprocess files last."""
  with open(DURATIONS) as f:
    recorded = json.load(f)
  slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
  root = str(config.rootpath)

  def seconds(item):
    name = os.path.relpath(str(item.path), root)
    return recorded.get(name, SECONDS_PER_SLOW_TEST * slow[item.path])
  items.sort(key=lambda item: -seconds(item))

"""The persistent XLA compilation cache of a run, ``<run_dir>/xla_cache``, or the directory JAX was
given (``JAX_COMPILATION_CACHE_DIR``), which every run that names it shares.

A run writes every program it compiles there; a restart or resume of the run (a preemption, a
crash, a larger ``train.steps``) reads them back instead of compiling again. JAX finds an entry by
a hash of the program, its compile options, the devices and the jax/jaxlib versions, so a changed
model or config misses the cache and compiles; it never runs a stale program. XLA:CPU checks that
an executable was compiled for this host's instruction set and recompiles when it was not. In a
multi-process run only process 0 writes entries (JAX's rule); every process reads them. JAX does
not write an entry atomically: one cut short by kill -9 is reported (a warning) and compiled
again at each start, never run; deleting the directory clears it.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

DIR_NAME = "xla_cache"
# JAX by default writes only programs that took a second or more to compile, which leaves out
# most of a run's programs and a quarter of a tiny CPU run's compile time
# (docs/results/benchmarks/compilation_cache.md); reading any entry back is faster than compiling it.
_CACHE_EVERYTHING = {"jax_persistent_cache_min_compile_time_secs": 0.0,
                     "jax_persistent_cache_min_entry_size_bytes": -1}


def run_cache_dir(config) -> str | None:
  """The cache directory JAX was already given (``JAX_COMPILATION_CACHE_DIR`` or
  ``jax.config.update('jax_compilation_cache_dir', ...)``: one cache for many runs, a sweep's or
  a test suite's), else ``<train.run_dir>/xla_cache``; None when ``train.compilation_cache`` is
  off."""
  if not config.train.compilation_cache:
    return None
  return jax.config.jax_compilation_cache_dir or os.path.join(config.train.run_dir, DIR_NAME)


@contextlib.contextmanager
def persistent(path: str | None) -> Iterator[str | None]:
  """Within the block, compiled programs are read from and written to ``path`` (None: JAX's
  settings are left as they are); the previous settings come back at its end."""
  if path is None:
    yield None
    return
  settings = {"jax_compilation_cache_dir": path, **_CACHE_EVERYTHING}
  previous = {name: getattr(jax.config, name) for name in settings}
  _apply(settings)
  try:
    with warnings.catch_warnings():
      # A write that fails costs a later start one compilation, nothing else; on a full disk the
      # run's own writes say so in one line (docs/reliability.md), which JAX's warning per
      # program would bury.
      warnings.filterwarnings("ignore", message="Error writing persistent compilation cache")
      yield path
  finally:
    _apply(previous)


def _apply(settings: dict) -> None:
  for name, value in settings.items():
    jax.config.update(name, value)
  # JAX decides whether to use a cache, and opens its directory, once per process at its first
  # compilation: without a reset, a process that compiled before (a notebook, the tests, a
  # second run) would go on with the old decision and directory.
  jax_cache.reset_cache()

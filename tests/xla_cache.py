"""One persistent XLA compilation cache for a whole test session.

Many tests compile the same tiny programs: in the pytest workers, and in the ``rljax train`` /
sweep / script subprocesses they start, each of which would otherwise compile everything from
scratch. ``tests/conftest.py`` points ``JAX_COMPILATION_CACHE_DIR`` at a fresh directory before
JAX is imported; both xdist workers and every subprocess inherit it, and ``rljax train`` uses it
instead of ``<run_dir>/xla_cache`` (rljax/runs/compilation_cache.py) and writes every program it
compiles there. Elsewhere JAX's threshold applies (programs that took a second or more to
compile): writing the many small programs that only one test compiles costs more than it saves
(~20% of an 8-device script's time). A cache hit loads the executable the miss compiled: results
are the same to the bit.

Tests stay off it (``env_without`` / ``off``) where they test the run's own cache, time a
compilation, or may cut a cache write short (kill -9 or a file-size limit): a truncated entry
is never run, but it would be read, warned about and compiled again by every later test that
needs that program.
"""
import contextlib
import os
import shutil
import tempfile

ENV = "JAX_COMPILATION_CACHE_DIR"
_CREATED = []


def start_session() -> None:
  """Point this process (and its children) at a new session cache, unless one is set already:
  an xdist worker inherits its controller's, and a user's own directory is kept."""
  if os.environ.get(ENV):
    return
  path = tempfile.mkdtemp(prefix="rljax-tests-xla-cache-")
  _CREATED.append(path)
  os.environ[ENV] = path


def end_session() -> None:
  """Delete the directory ``start_session`` made in this process (the controller's, under xdist,
  after its workers are gone)."""
  while _CREATED:
    shutil.rmtree(_CREATED.pop(), ignore_errors=True)


def env_without(env: dict | None = None) -> dict:
  """``env`` (default ``os.environ``) without the session cache: a subprocess started with it
  compiles into its run's own cache (``<run_dir>/xla_cache``) or none."""
  env = dict(os.environ if env is None else env)
  env.pop(ENV, None)
  return env


@contextlib.contextmanager
def off():
  """In this process, within the block: JAX has no cache directory, as in a process started
  without ``JAX_COMPILATION_CACHE_DIR`` (``rljax train`` then uses ``<run_dir>/xla_cache``)."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache as jax_cache
  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", None)
  jax_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
    jax_cache.reset_cache()

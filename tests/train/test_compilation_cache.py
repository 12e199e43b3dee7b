"""``train.compilation_cache``: programs compiled in a run land in ``<run_dir>/xla_cache``, a later
compilation of the same program reads them, and the process's settings come back afterwards."""
import os

import jax
import jax.numpy as jnp

import rljax
from rljax.runs import compilation_cache
from tests import xla_cache


def fresh_program():
  """A new jitted function each call: its compilation misses JAX's in-memory caches."""
  return jax.jit(lambda x: jnp.tanh(3.0 * x).sum())


def test_a_second_compilation_reads_the_run_cache(tmp_path):
  path = str(tmp_path / compilation_cache.DIR_NAME)
  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  events = []
  listener = lambda event, **kwargs: events.append(event)  # noqa: E731
  jax.monitoring.register_event_listener(listener)
  try:
    with compilation_cache.persistent(path):
      fresh_program()(jnp.ones(7)).block_until_ready()
      written = os.listdir(path)
      events.clear()
      fresh_program()(jnp.ones(7)).block_until_ready()
  finally:
    jax.monitoring.unregister_event_listener(listener)
  assert written, "a tiny program is cached too (no compile-time threshold)"
  assert "/jax/compilation_cache/cache_hits" in events
  assert (jax.config.jax_compilation_cache_dir,
          jax.config.jax_persistent_cache_min_compile_time_secs) == before


def test_the_run_dir_holds_the_cache_unless_switched_off():
  config = rljax.config()
  config.train.run_dir = "/tmp/some_run"
  with xla_cache.off():
    assert compilation_cache.run_cache_dir(config) == "/tmp/some_run/xla_cache"
  config.train.compilation_cache = False
  assert compilation_cache.run_cache_dir(config) is None


def test_a_cache_dir_given_to_jax_is_shared_by_runs(tmp_path):
  """``JAX_COMPILATION_CACHE_DIR`` (here set through jax.config) replaces the run's own cache."""
  config = rljax.config()
  config.train.run_dir = "/tmp/some_run"
  with xla_cache.off():
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    assert compilation_cache.run_cache_dir(config) == str(tmp_path)
    config.train.compilation_cache = False
    assert compilation_cache.run_cache_dir(config) is None

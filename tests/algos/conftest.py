"""Shared fixtures for the rljax.algos tests.

``prec`` runs a test once in float32 (rtol 1e-5) and once in float64 (rtol 1e-6). float64 is
switched on with the ``jax.enable_x64`` context manager for that test only: every test file shares
one pytest process, and a leaked ``jax_enable_x64`` would change other files' dtypes.
"""
import dataclasses

import jax
import numpy as np
import pytest


@dataclasses.dataclass(frozen=True)
class Precision:
  dtype: type
  rtol: float
  atol: float


@pytest.fixture(params=["float32", "float64"])
def prec(request):
  if request.param == "float64":
    with jax.enable_x64(True):
      yield Precision(np.float64, 1e-6, 1e-9)
  else:
    with jax.enable_x64(False):
      yield Precision(np.float32, 1e-5, 1e-6)


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield Precision(np.float64, 1e-6, 1e-9)


@pytest.fixture(autouse=True)
def _x64_does_not_leak():
  before = jax.config.jax_enable_x64
  yield
  assert jax.config.jax_enable_x64 == before, "a test leaked jax_enable_x64"


@pytest.fixture
def algo_cfg():
  """A fresh copy of the base config's ``algo`` section (real keys only)."""
  from configs.base import get_config
  return get_config().algo

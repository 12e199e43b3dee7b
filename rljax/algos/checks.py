"""Argument checks for components whose float hyperparameters may arrive traced.

``rljax.algorithm.resolve`` passes float hyperparameters as traced arrays (a sweep reuses one
compilation) and range-checks the config once at start-up; a component called directly with a
Python number still gets a clear error naming the config key.
"""
import numbers


def is_static_number(value) -> bool:
  """True for a Python/NumPy real number (checkable now), False for arrays and tracers."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_range(key: str, value, *, lo=None, hi=None, lo_open=False, hi_open=False) -> None:
  """Raise ``ValueError`` naming ``key`` when a static ``value`` is outside the range; traced
  values are not checked here (``resolve`` did)."""
  if not is_static_number(value):
    return
  low_bad = lo is not None and (value <= lo if lo_open else value < lo)
  high_bad = hi is not None and (value >= hi if hi_open else value > hi)
  if low_bad or high_bad or value != value:
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    raise ValueError(f"{key}={value!r} is out of range: must be in {left}"
                     f"{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}")

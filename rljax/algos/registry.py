"""Name -> function registries for the algorithm components of ALGORITHMS.md.

An algorithm is a configuration: ``configs/<algo>.py`` names an advantage estimator, a policy
objective, a loss aggregation and a KL estimator, and the trainer looks each name up here. A name
that is not registered is an error that lists what exists, so a typo in a config fails at start-up
instead of silently running another algorithm.
"""
from typing import Any, Callable, Dict, List


class UnknownNameError(KeyError, ValueError):
  """A config names a component that is not registered.

  Subclasses both ``KeyError`` (a failed lookup) and ``ValueError`` (a bad config value), so
  callers may catch either.
  """

  def __str__(self):
    # KeyError.__str__ would print the repr of the message, quotes and escapes included.
    return str(self.args[0])


class Registry:
  """A named family of interchangeable components (e.g. the advantage estimators).

  ``register(name, **meta)`` is a decorator; ``meta`` holds static facts the dispatcher needs
  without calling the function (e.g. that GSPO forces its own loss aggregation).
  """

  def __init__(self, family: str, config_key: str = ""):
    self.family = family
    self.config_key = config_key
    self._fns: Dict[str, Callable[..., Any]] = {}
    self._meta: Dict[str, Dict[str, Any]] = {}

  def register(self, name: str, **meta) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.family}: a registered name must be a non-empty string, got {name!r}")

    def decorator(fn):
      if name in self._fns:
        raise ValueError(f"{self.family}: {name!r} is already registered")
      self._fns[name] = fn
      self._meta[name] = dict(meta)
      return fn

    return decorator

  def _check(self, name: str) -> None:
    if name not in self._fns:
      where = f" ({self.config_key})" if self.config_key else ""
      raise UnknownNameError(
          f"unknown {self.family} {name!r}{where}; registered {self.family} names: "
          f"{', '.join(self.names())}")

  def get(self, name: str) -> Callable[..., Any]:
    self._check(name)
    return self._fns[name]

  def meta(self, name: str) -> Dict[str, Any]:
    self._check(name)
    return dict(self._meta[name])

  def names(self) -> List[str]:
    return sorted(self._fns)

  def __contains__(self, name: str) -> bool:
    return name in self._fns

  def __repr__(self):
    return f"Registry({self.family!r}, {self.names()})"


ADVANTAGES = Registry("advantage estimator", "algo.advantage")
POLICY_LOSSES = Registry("policy objective", "algo.policy_loss")
LOSS_AGGS = Registry("loss aggregation", "algo.loss_agg")
KL_ESTIMATORS = Registry("KL estimator", "algo.kl_estimator")

_ALL = {
    "advantage": ADVANTAGES,
    "policy_loss": POLICY_LOSSES,
    "loss_agg": LOSS_AGGS,
    "kl_estimator": KL_ESTIMATORS,
}


def register_advantage(name: str, **meta):
  return ADVANTAGES.register(name, **meta)


def register_policy_loss(name: str, **meta):
  return POLICY_LOSSES.register(name, **meta)


def register_loss_agg(name: str, **meta):
  return LOSS_AGGS.register(name, **meta)


def register_kl_estimator(name: str, **meta):
  return KL_ESTIMATORS.register(name, **meta)


def list_registries() -> Dict[str, List[str]]:
  """``{config key: registered names}`` for every family (all of ``rljax.algos`` is imported)."""
  return {key: reg.names() for key, reg in _ALL.items()}

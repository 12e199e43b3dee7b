"""Name -> function registries for the algorithm components of docs/algorithms.md.

An algorithm is a configuration: ``configs/algos/<algo>.py`` names an advantage estimator, a policy
objective, a loss aggregation, a KL estimator and the regularisers' coefficients, and
``rljax.algorithm.resolve`` looks each name up once, at start-up. A name that is not registered is
an error that lists what exists, so a typo in a config fails in the first second instead of
silently running another algorithm.

A registered component is a plain function. Its positional parameters are its *inputs*, passed
by name from the arrays the trainer has (``rewards``, ``mask``, ``logp``, ``old_logp``,
``advantages``, ...); its keyword-only parameters are *hyperparameters*, read from the ``algo``
config section under the key ``hparams`` maps them to (by default the parameter's own name).
"""
import inspect
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from rljax.errors import UnknownNameError  # noqa: F401  (re-exported)
from rljax.config.declare import add_family


def signature_of(fn: Callable, hparams: Optional[Mapping[str, str]] = None
                 ) -> Tuple[Tuple[str, ...], Dict[str, str], Dict[str, Any]]:
  """``(inputs, {keyword: config key}, {keyword: default})`` of a component function.

  Inputs are the parameters that can be passed positionally; hyperparameters are the
  keyword-only ones, each read from the config key ``hparams`` names (default: its own name).
  Every keyword-only parameter is read from the config when the config has its key, default or
  not: a default applies only where the config has no such key (a notebook component's own
  setting), never instead of a value the config gives.
  """
  hparams = dict(hparams or {})
  inputs, keys, defaults = [], {}, {}
  for p in inspect.signature(fn).parameters.values():
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
      inputs.append(p.name)
    elif p.kind == p.KEYWORD_ONLY:
      keys[p.name] = hparams.pop(p.name, p.name)
      if p.default is not p.empty:
        defaults[p.name] = p.default
  if hparams:
    raise ValueError(f"{fn.__name__}: hparams names {sorted(hparams)}, which are not keyword-only "
                     "parameters of the function")
  return tuple(inputs), keys, defaults


class Registry:
  """A named family of interchangeable components (e.g. the advantage estimators).

  ``register(name, hparams=None, **meta)`` is a decorator; ``hparams`` maps the function's
  keyword-only parameters to config keys, ``meta`` holds static facts the resolver needs without
  calling the function (e.g. that GSPO forces its own loss aggregation).
  """

  def __init__(self, family: str, config_key: str = ""):
    self.family = family
    self.config_key = config_key
    self._fns: Dict[str, Callable[..., Any]] = {}
    self._meta: Dict[str, Dict[str, Any]] = {}

  def register(self, name: str, hparams: Optional[Mapping[str, str]] = None, **meta
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.family}: a registered name must be a non-empty string, got {name!r}")

    def decorator(fn):
      if name in self._fns:
        raise ValueError(f"{self.family}: {name!r} is already registered")
      inputs, keys, defaults = signature_of(fn, hparams)
      self._fns[name] = fn
      self._meta[name] = dict(meta, inputs=inputs, hparams=keys, defaults=defaults)
      return fn

    return decorator

  def unregister(self, name: str) -> None:
    """Removes ``name`` (a notebook re-running the cell that registered it)."""
    self._check(name)
    del self._fns[name], self._meta[name]

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
REGULARIZERS = Registry("regulariser", "algo.<name>_coef")

_ALL = {
    "advantage": ADVANTAGES,
    "policy_loss": POLICY_LOSSES,
    "loss_agg": LOSS_AGGS,
    "kl_estimator": KL_ESTIMATORS,
    "regularizer": REGULARIZERS,
}
for _family, _registry in _ALL.items():  # what ``registered(family)`` keys look names up in
  add_family(_family, _registry)


def register_advantage(name: str, hparams: Optional[Mapping[str, str]] = None, **meta):
  """Estimator ``fn(<inputs>, *, <hyperparameters>) -> A[B, T]`` (or ``(A, returns)`` with
  ``critic_targets=True``). Meta: ``whitened`` (never whitened twice), ``min_group_size``,
  ``ignored_keys(algo settings) -> set`` (hyperparameters another setting overrides)."""
  return ADVANTAGES.register(name, hparams, **meta)


def register_policy_loss(name: str, hparams: Optional[Mapping[str, str]] = None, **meta):
  """Objective ``fn(logp, old_logp, advantages, mask, ..., *, <hyperparameters>) -> (l, metrics)``:
  per-token losses ``[B, T]`` (per-sequence ``[B]`` with ``loss_agg='sequence_mean'``) and
  ``{name: (sum, count)}`` metrics. Meta ``loss_agg`` forces an aggregation."""
  return POLICY_LOSSES.register(name, hparams, **meta)


def register_loss_agg(name: str, **meta):
  return LOSS_AGGS.register(name, None, **meta)


def register_kl_estimator(name: str, **meta):
  return KL_ESTIMATORS.register(name, None, **meta)


def register_regularizer(name: str, hparams: Optional[Mapping[str, str]] = None, *,
                         coef: str, agg: Any = "policy", token_mask: Optional[Callable] = None,
                         enabled: Optional[Callable[[Mapping[str, Any]], bool]] = None):
  """An auxiliary loss ``coef * agg(values)`` added to the policy loss.

  ``fn(<inputs>, *, <hyperparameters>) -> values[B, T]`` (inputs by name: ``logp``, ``entropy``,
  ``mask`` and any batch field). ``coef``: the config key of its weight (traced, so a sweep over
  it reuses one compilation; ``kl_coef`` follows the adaptive controller). ``agg``: a loss
  aggregation name, ``'policy'`` (the policy loss's, token-level for per-sequence objectives), or
  ``fn(algo settings) -> name``. ``token_mask``: ``fn(<batch fields>) -> mask[B, T]`` restricting
  the tokens it averages over (default: the loss mask). ``enabled``: ``fn(algo settings) -> bool``
  (default: ``coef`` is non-zero).
  """
  return REGULARIZERS.register(name, hparams, coef=coef, agg=agg, token_mask=token_mask,
                               enabled=enabled)


def get_family(family: str) -> Registry:
  """The registry of ``family`` (a key of ``list_registries``)."""
  return _ALL[family]


def list_registries() -> Dict[str, List[str]]:
  """``{config key: registered names}`` for every family (all of ``rljax.algos`` is imported)."""
  return {key: reg.names() for key, reg in _ALL.items()}

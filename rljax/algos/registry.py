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
from typing import Any, Callable, Dict, List, Mapping, Optional

from rljax.errors import UnknownNameError  # noqa: F401  (re-exported)
from rljax.registries import (ADVANTAGES, KL_ESTIMATORS, LOSS_AGGS, POLICY_LOSSES,  # noqa: F401
                              REGULARIZERS, Registry, signature_of)

_ALL = {registry.kind: registry for registry in (ADVANTAGES, POLICY_LOSSES, LOSS_AGGS,
                                                   KL_ESTIMATORS, REGULARIZERS)}


def register_advantage(name: str, hparams: Optional[Mapping[str, str]] = None, **meta):
  """Estimator ``fn(<inputs>, *, <hyperparameters>) -> A[B, T]`` (or ``(A, returns)`` with
  ``critic_targets=True``). Meta: ``whitened`` (never whitened twice), ``min_group_size``,
  ``ignored_keys(algo settings) -> set`` (hyperparameters another setting overrides)."""
  return ADVANTAGES.register(name, hparams=hparams, **meta)


def register_policy_loss(name: str, hparams: Optional[Mapping[str, str]] = None, **meta):
  """Objective ``fn(logp, old_logp, advantages, mask, ..., *, <hyperparameters>) -> (l, metrics)``:
  per-token losses ``[B, T]`` (per-sequence ``[B]`` with ``loss_agg='sequence_mean'``) and
  ``{name: (sum, count)}`` metrics. Meta ``loss_agg`` forces an aggregation."""
  return POLICY_LOSSES.register(name, hparams=hparams, **meta)


def register_loss_agg(name: str, **meta):
  return LOSS_AGGS.register(name, **meta)


def register_kl_estimator(name: str, **meta):
  return KL_ESTIMATORS.register(name, **meta)


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
  return REGULARIZERS.register(name, hparams=hparams, coef=coef, agg=agg, token_mask=token_mask,
                               enabled=enabled)


def list_registries() -> Dict[str, List[str]]:
  """``{family: registered names}`` of the algorithm components."""
  return {key: reg.names() for key, reg in _ALL.items()}

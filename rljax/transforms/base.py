"""The transform protocol: a piece of an algorithm with state and hooks (optax's init/update).

A transform is what is not one pure loss term: a controller with state (the adaptive KL and
entropy coefficients), a correction of the batch (rollout IS weights and rejection), a token
selection (Clip-Cov / KL-Cov, the 80/20 entropy mask), an extra rollout (ReMax's greedy
baseline), a host check (pass@k's binary rewards) or a frozen second model (on-policy
distillation's teacher). The trainer calls every hook of every resolved transform at fixed
points of the step and never names one:

  host     on_rollout(HostRollout) -> (rollout, info)       after sampling, before filtering
  compiled init() -> state                                  in TrainState.transforms[name]
           coefs(state) -> {hparams key: value}             traced coefficients it drives
           advantage_inputs(rollout, G) -> {input: array}   extra estimator inputs
           on_score(Scored) -> (changes, metrics)           after the estimator, in `score`
           on_minibatch(Minibatch) -> (extras, metrics)     per optimizer minibatch, before it
                                                            is split into micro-batches
           on_loss(arrays) -> metrics                       per micro-batch, in the actor loss
           on_step(state, hp, batch, metrics) -> (state, metrics)   once per RL step
  host     check_step(metrics, step)                        after each step's metrics
  build    aux_role: the role (``rljax.loading.roles``) of a frozen model it scores with,
           loaded and checked by ``rljax.loading`` (before the run dir is claimed)

Fields a transform adds to the rollout record travel in ``Rollout.extras`` (sharded by rows like
every other field); ``loss_weight`` names an extras field that multiplies the per-token policy
loss. A transform module registers a factory with ``register_transform(name, order)``:
``factory(algo settings, hparams) -> Transform | None`` (None: off for this config); it adds its
float hyperparameters to ``hparams`` (traced) and lists the ``algo.*`` keys it reads in ``keys``.
``order`` fixes the order of the hooks of different transforms.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from rljax.registries import LOSS_AGGS, POLICY_LOSSES, TRANSFORMS

Metrics = Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Transform:
  name: str
  keys: Tuple[str, ...] = ()  # algo.* keys this transform reads (the unused-key check)
  needs_old_logp: bool = False  # scoring must run the policy forward before the update
  drives: Tuple[str, ...] = ()  # regulariser coefficients it sets: their term is on from 0
  loss_weight: Optional[str] = None  # extras field multiplying the per-token policy loss
  init: Optional[Callable[[], Any]] = None
  coefs: Optional[Callable[[Any], Dict[str, Any]]] = None
  on_rollout: Optional[Callable[["HostRollout"], Tuple[Any, Dict[str, float]]]] = None
  advantage_inputs: Optional[Callable[[Any, int], Dict[str, Any]]] = None
  on_score: Optional[Callable[["Scored"], Tuple[Dict[str, Any], Metrics]]] = None
  on_minibatch: Optional[Callable[["Minibatch"], Tuple[Dict[str, Any], Metrics]]] = None
  on_loss: Optional[Callable[[Mapping[str, Any]], Metrics]] = None
  on_step: Optional[Callable[..., Tuple[Any, Metrics]]] = None
  check_step: Optional[Callable[[Mapping[str, float], int], None]] = None
  aux_role: Optional[str] = None  # a frozen model it scores with (a role of rljax.loading)


@dataclasses.dataclass(frozen=True)
class HostRollout:
  """What ``on_rollout`` sees: a sampled, verified round (NumPy ``Rollout``) and how to sample
  more (``sample(problems, key, sampling, group_size) -> Rollout``)."""
  rollout: Any
  problems: Any
  key: Any
  sampling: Any
  group_size: int
  sample: Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Scored:
  """What ``on_score`` sees inside the compiled ``score``: the rollout, the valid-token ``mask``,
  the current ``loss_mask`` and ``advantages`` (earlier transforms' changes applied), the scoring
  forward's ``old_logp`` / ``entropy`` (None when the loss's forward gives them; with
  ``algo.old_logp='sampler'`` ``old_logp`` is the sampler's and ``entropy`` None), ``hp`` (with
  the transforms' coefficients) and ``aux_logp(name)``: log-probs of the completion tokens under
  the frozen model of transform ``name``. ``changes`` may set ``loss_mask``, ``advantages`` and
  ``extras`` (fields added to the record)."""
  rollout: Any
  hp: Mapping[str, Any]
  group_size: int
  mask: Any
  loss_mask: Any
  advantages: Any
  old_logp: Any
  entropy: Any
  aux_logp: Callable[[str], Any]

  def apply(self, changes: Mapping[str, Any]) -> "Scored":
    extras = changes.get("extras", {})
    rollout = self.rollout.replace(extras={**self.rollout.extras, **extras}) if extras \
        else self.rollout
    fields = {k: v for k, v in changes.items() if k != "extras"}
    return dataclasses.replace(self, rollout=rollout, **fields)


@dataclasses.dataclass(frozen=True)
class Minibatch:
  """What ``on_minibatch`` sees: one whole optimizer minibatch (a ``Rollout``), ``hp``, the run's
  ``seed``, the RL ``step`` and the update's ``index`` within the step."""
  rollout: Any
  hp: Mapping[str, Any]
  seed: int
  step: Any
  index: Any


def register_transform(name: str, *, order: int, reads: Tuple[str, ...]):
  """``factory(algo settings, hparams) -> Transform | None`` under ``name``; ``reads``: every
  ``algo.*`` key it may read (the resolved ``Transform.keys`` is the part a config uses), named
  when a key is set that nothing resolved reads."""
  return TRANSFORMS.register(name, order=order, reads=tuple(f"algo.{key}" for key in reads))


def resolve_transforms(algo: Mapping[str, Any], hparams: Dict[str, float]
                       ) -> Tuple[Transform, ...]:
  """Every registered transform the ``algo`` settings switch on, in hook order."""
  names = sorted(TRANSFORMS.names(), key=lambda n: TRANSFORMS.meta(n)["order"])
  made = (TRANSFORMS.get(name)(algo, hparams) for name in names)
  return tuple(t for t in made if t is not None)


def traced(hparams: Dict[str, float], algo: Mapping[str, Any], *keys: str) -> Tuple[str, ...]:
  """Adds the set (non-None) float ``keys`` to the traced ``hparams``; returns ``keys``."""
  for key in keys:
    if algo[key] is not None:
      hparams[key] = float(algo[key])
  return keys


def level(algo: Mapping[str, Any], key: str) -> Optional[str]:
  """A ``none | token | sequence | geometric`` switch: None when off."""
  return None if algo[key] == "none" else algo[key]


def per_sequence_objective(algo: Mapping[str, Any]) -> bool:
  """Whether the resolved objective gives one loss per sequence (no per-token weights)."""
  agg = POLICY_LOSSES.meta(algo["policy_loss"]).get("loss_agg") or algo["loss_agg"]
  return bool(LOSS_AGGS.meta(agg).get("per_sequence"))

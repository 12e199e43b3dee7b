"""An algorithm resolved once: config names -> function objects with bound hyperparameters.

``resolve(config)`` runs at start-up, before any model is built: it looks up every registered
name of the ``algo`` section (an unknown one fails listing the registered names), checks every
``algo.*`` key against its declaration (``rljax/config/table.py``), refuses a key set away from its
default that nothing resolved reads (``rljax.config.checks.check_unused``), and returns an
``Algorithm``. Below this point nothing reads a ConfigDict. It sits above ``rljax.algos`` (the
components) and ``rljax.transforms`` (the stateful pieces it resolves too).

Hyperparameters: a float key a component reads is *traced*: it travels as an entry of the
``hparams`` dict passed to the compiled step, so a sweep over a coefficient (or a ``vmap`` over
it) reuses one compilation. Everything else (names, modes, ``None`` = off, integers that fix
shapes) is bound statically.

  algo = resolve(config)
  adv, returns = algo.advantages(rewards=r, mask=m)                       # [B, T]
  loss_sum, metrics = algo.policy_loss_sum(logp=lp, old_logp=old, advantages=adv, mask=m)
  loss = loss_sum / algo.policy_loss_count(m)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import chex
import jax
import jax.numpy as jnp

from rljax.config import checks as config_checks
from rljax.algos import advantages as adv_lib
from rljax.algos import kl as kl_lib
from rljax.algos import losses as loss_lib
from rljax.algos.registry import (ADVANTAGES, KL_ESTIMATORS, LOSS_AGGS, POLICY_LOSSES,
                                  REGULARIZERS, Registry, signature_of)
from rljax.transforms import resolve_transforms

Hparams = Mapping[str, chex.Numeric]


def _is_traced_value(value) -> bool:
  return isinstance(value, float)


@dataclasses.dataclass(frozen=True)
class Bound:
  """A registered function with its static hyperparameters bound.

  ``bound(hp, **arrays)`` calls the function with its inputs taken by name from ``arrays`` and
  its traced hyperparameters from ``hp`` (the algorithm's ``hparams`` or a traced copy).
  """
  name: str
  fn: Callable[..., Any]
  inputs: Tuple[str, ...]
  static: Tuple[Tuple[str, Any], ...]
  traced: Tuple[Tuple[str, str], ...]  # (keyword, hparams key)
  keys: Tuple[str, ...] = ()  # the algo.* keys it was bound from

  def __call__(self, hp: Hparams, **arrays):
    kwargs = {k: arrays[k] for k in self.inputs if k in arrays}
    kwargs.update(self.static)
    kwargs.update({kw: hp[key] for kw, key in self.traced})
    return self.fn(**kwargs)


def bind(registry: Registry, name: str, algo: Mapping[str, Any], hparams: Dict[str, float]
         ) -> Bound:
  """Looks ``name`` up in ``registry`` and binds its hyperparameters from the ``algo`` settings;
  the traced ones are added to ``hparams``."""
  fn, meta = registry.get(name), registry.meta(name)
  static, traced, keys = [], [], []
  for kw, key in meta["hparams"].items():
    if key not in algo and kw in meta["defaults"]:
      static.append((kw, meta["defaults"][kw]))
      continue
    if key not in algo:
      raise KeyError(f"{registry.what} {name!r} reads algo.{key}, which the config does not "
                     f"have: add it to the algo section of the config")
    keys.append(key)
    value = algo[key]
    if _is_traced_value(value):
      hparams[key] = value
      traced.append((kw, key))
    else:
      static.append((kw, value))
  return Bound(name, fn, meta["inputs"], tuple(static), tuple(traced), tuple(keys))


@dataclasses.dataclass(frozen=True)
class Regularizer:
  """An auxiliary loss ``coef * sum / count`` (sections 5 and 8): its per-token values, the
  tokens it averages over, its aggregation and the ``hparams`` key of its weight."""
  values: Bound
  token_mask: Optional[Callable[..., chex.Array]]
  agg: str
  coef: str

  @property
  def name(self) -> str:
    return self.values.name

  def mask(self, arrays: Mapping[str, chex.Array]) -> chex.Array:
    if self.token_mask is None:
      return arrays["mask"]
    inputs = signature_of(self.token_mask)[0]
    return self.token_mask(**{k: arrays[k] for k in inputs if k in arrays})

  def loss_sum(self, hp: Hparams, norm_constant, **arrays) -> chex.Array:
    return loss_lib.agg_sum(self.agg, self.values(hp, **arrays), self.mask(arrays), norm_constant)

  def count(self, **arrays) -> chex.Array:
    return loss_lib.agg_count(self.agg, self.mask(arrays))


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """The ``algo`` section resolved: components, static choices and the traced ``hparams``."""
  advantage: Bound
  critic_targets: bool  # the estimator also returns critic targets (GAE)
  whiten: bool  # algo.adv_whiten, for estimators that do not whiten by definition
  objective: Bound
  policy_agg: str  # forced by the objective or algo.loss_agg (may be per-sequence)
  regularizers: Tuple[Regularizer, ...]
  kl_placement: Optional[str]  # 'loss' | 'reward' | None (no reference model)
  kl_estimator: str
  ref_mode: str  # algo.ref_update: 'frozen' | 'ema'
  transforms: Tuple[Any, ...]  # rljax.transforms.Transform, in hook order
  overlong_filter: bool
  group_size: int
  epochs: int
  minibatches: int
  micro_batches: int
  hparams: Dict[str, float]
  # algo.old_logp: 'recompute' (a policy forward before the update) | 'sampler' (the sampler's
  # recorded log-probs, rljax.learner.step.StepSpec.scoring_forward)
  old_logp: str = "recompute"
  # The algo.* keys (leaf names) its components bind: the estimator's and the objective's
  # hyperparameters (less those their registration says another setting overrides), the
  # regularisers' values and weights, the transforms' keys. ``component_reads()`` in
  # rljax/config/table.py reads it.
  keys_read: frozenset = frozenset()

  @property
  def needs_old_logp(self) -> bool:
    """Whether a transform needs the policy's log-probs (or H_old) before the update."""
    return any(t.needs_old_logp for t in self.transforms)

  @property
  def loss_weights(self) -> Tuple[str, ...]:
    """Rollout extras that multiply the per-token policy loss (IS weights, the 80/20 mask)."""
    return tuple(t.loss_weight for t in self.transforms if t.loss_weight)

  def transform(self, name: str):
    """The resolved transform ``name``, or None when the config leaves it off."""
    return next((t for t in self.transforms if t.name == name), None)

  def _hp(self, hp: Optional[Hparams]) -> Hparams:
    return self.hparams if hp is None else hp

  @staticmethod
  def _norm_constant(hp):
    return hp.get("loss_norm_constant")  # None: max_new_tokens

  # --- advantages ----------------------------------------------------------------------------

  def advantages(self, *, rewards: chex.Array, mask: chex.Array,
                 values: Optional[chex.Array] = None,
                 token_rewards: Optional[chex.Array] = None, hp: Optional[Hparams] = None,
                 **arrays) -> Tuple[chex.Array, Optional[chex.Array]]:
    """Advantages ``[B, T]`` (0 on padding) and critic targets (GAE) or None.

    ``token_rewards`` defaults to the outcome reward on each row's last valid token; further
    ``arrays`` reach the estimator by name (e.g. ReMax's ``remax_baseline[P]``).
    """
    chex.assert_rank([rewards, mask], [1, 2])
    chex.assert_equal_shape_prefix([rewards, mask], 1)
    if token_rewards is None:
      token_rewards = adv_lib.outcome_token_rewards(rewards, mask)
    out = self.advantage(self._hp(hp), rewards=rewards, mask=mask, group_size=self.group_size,
                         values=values, token_rewards=token_rewards, **arrays)
    adv, returns = out if self.critic_targets else (out, None)
    if self.whiten:
      adv = adv_lib.whiten(adv, mask)
    return adv, returns

  # --- the policy loss -----------------------------------------------------------------------

  def policy_loss_sum(self, *, logp: chex.Array, old_logp: chex.Array, advantages: chex.Array,
                      mask: chex.Array, hp: Optional[Hparams] = None, **arrays
                      ) -> Tuple[chex.Array, loss_lib.Metrics]:
    """``(loss sum, metrics)`` of one micro-batch; the minibatch's policy loss is the sum over
    its micro-batches divided once by ``policy_loss_count`` of the whole minibatch mask.

    The transforms' ``loss_weights`` (rollout IS weights ``is_weight``, 8.2; the 80/20 mask
    ``entropy_keep``, 8.4) come by name in ``arrays`` and multiply the per-token policy loss
    (``m`` unchanged, so the counts are too); each is required while its transform is on.
    """
    hp = self._hp(hp)
    loss, metrics = self.objective(hp, logp=logp, old_logp=old_logp, advantages=advantages,
                                   mask=mask, **arrays)
    for name in self.loss_weights:
      if arrays.get(name) is None:
        raise ValueError(f"policy_loss_sum needs `{name}`: its transform is on (section 8)")
      loss = loss * arrays[name]
    return loss_lib.agg_sum(self.policy_agg, loss, mask, self._norm_constant(hp)), metrics

  def policy_loss_count(self, mask: chex.Array) -> chex.Array:
    """The denominator of ``policy_loss_sum`` over the whole minibatch ``mask``."""
    return loss_lib.agg_count(self.policy_agg, mask)

  # --- regularisers and the reference --------------------------------------------------------

  def regularizer_sum(self, reg: Regularizer, hp: Optional[Hparams] = None, **arrays):
    return reg.loss_sum(self._hp(hp), self._norm_constant(self._hp(hp)), **arrays)

  def ref_update(self, ref_params, params, hp: Optional[Hparams] = None):
    """``frozen``: ``ref_params``; ``ema``: ``d ref + (1 - d) params`` (T1's dynamic anchor)."""
    if self.ref_mode == "frozen":
      return ref_params
    return kl_lib.ema_update(ref_params, params, self._hp(hp)["ref_ema_decay"])

  def kl(self, logp: chex.Array, ref_logp: chex.Array) -> chex.Array:
    """The configured KL estimate ``[B, T]`` (for metrics and KL in the reward)."""
    return kl_lib.kl_estimate(self.kl_estimator, logp, ref_logp)


def _plain(config) -> Dict[str, Any]:
  return config.to_dict() if hasattr(config, "to_dict") else dict(config)


# --- resolve -------------------------------------------------------------------------------------

def resolve(config, *, group_size: Optional[int] = None, critic: Optional[bool] = None
            ) -> Algorithm:
  """The ``Algorithm`` of a whole config (or of an ``algo`` section with ``group_size`` and
  ``critic`` given). Fails on an unknown name, an out-of-range key, a combination that cannot
  run, or (for a whole config, what a run resolves) a key set away from its default that nothing
  resolved reads, naming the key."""
  settings = _plain(config)
  if "algo" in settings:
    algo = _plain(settings["algo"])
    group_size = settings["rollout"]["group_size"] if group_size is None else group_size
    critic = settings["critic"]["enabled"] if critic is None else critic
  else:
    algo = settings
    group_size = 2 if group_size is None else group_size
    critic = False if critic is None else critic
  config_checks.check_section("algo", algo)  # each key against its declaration
  hparams: Dict[str, float] = {}
  if algo["loss_norm_constant"] is not None:
    hparams["loss_norm_constant"] = float(algo["loss_norm_constant"])

  advantage = bind(ADVANTAGES, algo["advantage"], algo, hparams)
  adv_meta = ADVANTAGES.meta(algo["advantage"])
  if "group_size" in advantage.inputs:
    minimum = adv_meta.get("min_group_size", 2)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < minimum:
      raise ValueError(f"algo.advantage={algo['advantage']!r} needs rollout.group_size >= "
                       f"{minimum} (a baseline from the other completions of the prompt), got "
                       f"{group_size!r}")
  if "values" in advantage.inputs and not critic:
    raise ValueError(f"algo.advantage={algo['advantage']!r} needs critic values: set "
                     "critic.enabled=True")
  if critic and not adv_meta.get("critic_targets") and "algo" in settings:
    raise ValueError(f"critic.enabled=True with algo.advantage={algo['advantage']!r}: this "
                     "estimator gives the critic no targets (returns); use an estimator with "
                     "critic targets (gae) or switch the critic off")

  LOSS_AGGS.get(algo["loss_agg"])  # a typo fails even when the objective overrides it
  objective = bind(POLICY_LOSSES, algo["policy_loss"], algo, hparams)
  policy_agg = POLICY_LOSSES.meta(algo["policy_loss"]).get("loss_agg") or algo["loss_agg"]
  if LOSS_AGGS.meta(policy_agg).get("per_sequence") and not POLICY_LOSSES.meta(
      algo["policy_loss"]).get("loss_agg"):
    raise ValueError(f"algo.loss_agg={policy_agg!r} aggregates one loss per sequence; "
                     f"algo.policy_loss={algo['policy_loss']!r} gives one per token")
  transforms = resolve_transforms(algo, hparams)
  driven = {coef for t in transforms for coef in t.drives}

  placement = algo["kl_placement"]
  if placement != "none":
    KL_ESTIMATORS.get(algo["kl_estimator"])
  regularizers = []
  for name in REGULARIZERS.names():
    meta = REGULARIZERS.meta(name)
    enabled = meta["enabled"](algo) if meta["enabled"] else bool(algo[meta["coef"]])
    # A transform that drives the weight (8.7's controller) turns the term on, even from 0.
    enabled = enabled or meta["coef"] in driven
    if not enabled:
      continue
    agg = meta["agg"](algo) if callable(meta["agg"]) else meta["agg"]
    agg = loss_lib.token_level_agg(policy_agg if agg == "policy" else agg)
    hparams[meta["coef"]] = float(algo[meta["coef"]])
    regularizers.append(Regularizer(bind(REGULARIZERS, name, algo, hparams),
                                    meta["token_mask"], agg, meta["coef"]))
  if algo["ref_update"] == "ema":
    hparams["ref_ema_decay"] = float(algo["ref_ema_decay"])
  algorithm = Algorithm(
      advantage=advantage, critic_targets=adv_meta.get("critic_targets", False),
      whiten=algo["adv_whiten"] and not adv_meta.get("whitened", False),
      objective=objective, policy_agg=policy_agg, regularizers=tuple(regularizers),
      kl_placement=None if placement == "none" else placement,
      kl_estimator=algo["kl_estimator"], ref_mode=algo["ref_update"],
      transforms=transforms,
      overlong_filter=bool(algo["overlong_filter"]), group_size=group_size,
      epochs=algo["epochs"], minibatches=algo["minibatches"],
      micro_batches=algo["micro_batches"], hparams=hparams, old_logp=algo["old_logp"],
      keys_read=_keys_read(algo, advantage, objective, regularizers, transforms))
  if "algo" in settings:  # a run's whole config; a bare algo section composes components
    config_checks.check_unused(settings, algorithm)
  return algorithm


def _keys_read(algo, advantage: Bound, objective: Bound, regularizers, transforms) -> frozenset:
  read = set()
  for registry, bound in ((ADVANTAGES, advantage), (POLICY_LOSSES, objective)):
    ignored = registry.meta(bound.name).get("ignored_keys")  # read, but overridden by another
    read |= set(bound.keys) - (ignored(algo) if ignored else set())
  for reg in regularizers:
    read |= set(reg.values.keys) | {reg.coef}
  for t in transforms:
    read |= set(t.keys)
  return frozenset(read)


def hparams_tree(algo: Algorithm, dtype=jnp.float32) -> Dict[str, jax.Array]:
  """``algo.hparams`` as float arrays, the argument the compiled step takes."""
  return {k: jnp.asarray(v, dtype) for k, v in algo.hparams.items()}

"""Rollout correction (docs/algorithms.md): rejection of sampler/trainer mismatch and truncated
importance weights sampler -> old, applied once per rollout batch after the advantages.
``algo.tis_cap = C`` is ``rollout_is='token'`` with cap C (not both)."""
from rljax.algos import correction
from rljax.algos.losses import scalar_metric
from rljax.transforms.base import (Transform, level, per_sequence_objective, register_transform,
                                   traced)


@register_transform("rollout_correction", order=30, reads=(
    "tis_cap", "rollout_is", "rollout_is_cap", "rollout_is_over_cap", "rollout_is_floor",
    "rollout_is_batch_norm",
    "rollout_rs", "rollout_rs_lo", "rollout_rs_hi", "rollout_rs_veto", "rollout_rs_k3"))
def make(algo, hparams):
  """Rollout correction sampler -> old, once per rollout batch after the advantages: rejection
  (``algo.rollout_rs`` levels, ``_veto``, ``_k3``) first, then importance weights over the kept
  tokens (``algo.rollout_is`` or its alias ``algo.tis_cap``), which multiply the policy loss only
  (not KL or entropy): ``l <- w l``, ``rho = exp(old_logp - sampler_logp)`` at the level's unit.
  Above ``algo.rollout_is_cap`` a weight is truncated, ``w = min(rho, cap)`` (TIS, Yao et al.
  2025; verl), or masked, ``w = rho [rho <= cap]``, the token still in the denominator (AReaL's
  decoupled objective; Fu et al. 2025, arXiv 2505.24298), by ``algo.rollout_is_over_cap``.
  Group statistics of the advantages include the rows rejected later (verl). rljax recomputes
  ``old_logp``, so with asynchronous sampling this also covers the staleness (docs/async.md)."""
  keys = ()
  rollout_is = level(algo, "rollout_is")
  if algo["tis_cap"] is not None:
    if rollout_is is not None:
      raise ValueError(f"algo.tis_cap={algo['tis_cap']!r} is an alias of algo.rollout_is='token' "
                       f"with algo.rollout_is_cap; algo.rollout_is={rollout_is!r} is set too: "
                       "set one of them")
    rollout_is, keys = "token", ("tis_cap",)
    hparams["rollout_is_cap"] = float(algo["tis_cap"])
  elif rollout_is is not None:
    keys = ("rollout_is",) + traced(hparams, algo, "rollout_is_cap")
  if rollout_is is not None:
    floor, cap = algo["rollout_is_floor"], hparams["rollout_is_cap"]
    if floor is not None and floor > cap:
      raise ValueError(f"algo.rollout_is_floor={floor!r} must be <= the cap {cap!r}")
    if per_sequence_objective(algo):
      raise ValueError(f"algo.rollout_is (or algo.tis_cap) weights per-token losses; "
                       f"algo.policy_loss={algo['policy_loss']!r} has one loss per sequence. "
                       "Switch it off or pick a per-token objective")
    keys += ("rollout_is_over_cap", "rollout_is_batch_norm") + traced(hparams, algo,
                                                                       "rollout_is_floor")
  rollout_rs = level(algo, "rollout_rs")
  if rollout_rs is not None:
    lo, hi = algo["rollout_rs_lo"], algo["rollout_rs_hi"]
    if lo is None or hi is None or lo > hi:
      raise ValueError(f"algo.rollout_rs={rollout_rs!r} needs algo.rollout_rs_lo <= "
                       f"algo.rollout_rs_hi, both set; got lo={lo!r}, hi={hi!r}")
    keys += ("rollout_rs",) + traced(hparams, algo, "rollout_rs_lo", "rollout_rs_hi")
  veto, k3 = algo["rollout_rs_veto"] is not None, algo["rollout_rs_k3"] is not None
  keys += tuple(k for k, on in (("rollout_rs_veto", veto), ("rollout_rs_k3", k3)) if on)
  traced(hparams, algo, "rollout_rs_veto", "rollout_rs_k3")
  rejection = rollout_rs is not None or veto or k3
  if rollout_is is None and not rejection:
    return None
  with_floor = rollout_is is not None and algo["rollout_is_floor"] is not None
  batch_norm, over_cap = bool(algo["rollout_is_batch_norm"]), algo["rollout_is_over_cap"]

  def on_score(view):
    """Rejection first, then the weights over the kept tokens (rejected tokens stay out of the
    batch normalisation). Group statistics of the advantages include the rejected rows (verl)."""
    hp, loss_mask, metrics, changes = view.hp, view.loss_mask, {}, {}
    if rejection:
      loss_mask, metrics = correction.rollout_rejection_mask(
          view.old_logp, view.rollout.sampler_logp, loss_mask, level=rollout_rs,
          lo=hp.get("rollout_rs_lo"), hi=hp.get("rollout_rs_hi"),
          veto=hp.get("rollout_rs_veto"), k3=hp.get("rollout_rs_k3"))
    if rollout_is is not None:
      weights, is_metrics = correction.rollout_is_weights(
          view.old_logp, view.rollout.sampler_logp, loss_mask, level=rollout_is,
          cap=hp["rollout_is_cap"], floor=hp.get("rollout_is_floor") if with_floor else None,
          batch_norm=batch_norm, over_cap=over_cap)
      metrics.update(is_metrics)
      changes["extras"] = {"is_weight": weights}
    changes["loss_mask"] = loss_mask
    return changes, {k: scalar_metric(v) for k, v in metrics.items()}

  return Transform("rollout_correction", keys=keys, needs_old_logp=True,
                   loss_weight="is_weight" if rollout_is is not None else None,
                   on_score=on_score)

"""The section 8 transforms as the trainer applies them (ALGORITHMS.md 8.2-8.8).

``resolve_transforms`` reads their ``algo.*`` keys once (``rljax.algos.resolve`` calls it) and
returns a ``Transforms`` of static switches; their float hyperparameters go into the traced
``hparams`` like every other component's. The functions below take arrays, ``hp`` and the
switches, never a config:

* ``correct_rollout`` (8.2): once per rollout batch, after advantages: rejection edits the loss
  mask, the truncated IS weights multiply the policy term only.
* ``minibatch_selection`` (8.3, 8.4): once per optimizer minibatch, before its first forward:
  Clip-Cov / KL-Cov's ``cov_sel`` and the 80/20 entropy ``keep`` mask.
* ``entropy_ctrl_update`` (8.7): once per RL step.

Pass@k (8.5) and ReMax (8.8) are registered estimators; on-policy distillation (8.6) is
``distill.add_opd_advantages`` after the estimator.
"""
import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

import chex
import jax.numpy as jnp

from rljax.algos import correction, cov, entropy
from rljax.algos.losses import Metrics

LEVEL_KEYS = ("rollout_is", "rollout_rs")


@dataclasses.dataclass(frozen=True)
class Transforms:
  """Which section 8 transforms are on (static); their numbers live in ``hparams``."""
  rollout_is: Optional[str] = None  # IS weight level; None = off (algo.tis_cap: 'token')
  is_floor: bool = False
  is_batch_norm: bool = False
  rollout_rs: Optional[str] = None  # rejection level; None = no ratio test
  rs_veto: bool = False
  rs_k3: bool = False
  cov_select: Optional[str] = None  # 'clip_cov' | 'kl_cov' (the objective's selection)
  entropy_mask: bool = False  # algo.entropy_top_rho < 1
  entropy_ctrl: bool = False
  entropy_ctrl_estimate: str = "full"
  opd: bool = False  # algo.opd_coef > 0
  opd_length_norm: bool = False
  opd_student_logp: str = "old"
  passk_k: Optional[int] = None  # set with algo.advantage='passk' (its metrics)
  remax: bool = False  # algo.advantage='remax' (the loop adds a greedy baseline)

  @property
  def rejection(self) -> bool:
    return self.rollout_rs is not None or self.rs_veto or self.rs_k3

  @property
  def correction(self) -> bool:
    return self.rollout_is is not None or self.rejection

  @property
  def needs_old_logp(self) -> bool:
    """Whether scoring must run the policy forward before the update (old_logp, H_old)."""
    return (self.correction or self.cov_select is not None or self.entropy_mask or self.opd
            or (self.entropy_ctrl and self.entropy_ctrl_estimate == "sampled"))


def _level(algo, key) -> Optional[str]:
  return None if algo[key] == "none" else algo[key]


def _traced(hparams: Dict[str, float], algo, *keys) -> None:
  for key in keys:
    if algo[key] is not None:
      hparams[key] = float(algo[key])


def resolve_transforms(algo: Mapping[str, Any], hparams: Dict[str, float], *,
                       per_sequence: bool) -> Transforms:
  """The switches of the ``algo`` settings; their floats added to ``hparams``. Raises a
  ``ValueError`` naming the key for a combination that cannot run."""
  return Transforms(**_correction(algo, hparams, per_sequence),
                    **_token_selection(algo, hparams, per_sequence),
                    **_entropy_ctrl_and_advantages(algo, hparams))


def _correction(algo, hparams, per_sequence) -> Dict[str, Any]:
  """8.2: ``algo.tis_cap = C`` is ``rollout_is='token'`` with cap C (not both)."""
  rollout_is = _level(algo, "rollout_is")
  if algo["tis_cap"] is not None:
    if rollout_is is not None:
      raise ValueError(f"algo.tis_cap={algo['tis_cap']!r} is an alias of algo.rollout_is='token' "
                       f"with algo.rollout_is_cap; algo.rollout_is={rollout_is!r} is set too: "
                       "set one of them")
    rollout_is = "token"
    hparams["rollout_is_cap"] = float(algo["tis_cap"])
  elif rollout_is is not None:
    _traced(hparams, algo, "rollout_is_cap")
  if rollout_is is not None:
    floor, cap = algo["rollout_is_floor"], hparams["rollout_is_cap"]
    if floor is not None and floor > cap:
      raise ValueError(f"algo.rollout_is_floor={floor!r} must be <= the cap {cap!r}")
    if per_sequence:
      raise ValueError(f"algo.rollout_is (or algo.tis_cap) weights per-token losses; "
                       f"algo.policy_loss={algo['policy_loss']!r} has one loss per sequence. "
                       "Switch it off or pick a per-token objective")
    _traced(hparams, algo, "rollout_is_floor")
  rollout_rs = _level(algo, "rollout_rs")
  if rollout_rs is not None:
    lo, hi = algo["rollout_rs_lo"], algo["rollout_rs_hi"]
    if lo is None or hi is None or lo > hi:
      raise ValueError(f"algo.rollout_rs={rollout_rs!r} needs algo.rollout_rs_lo <= "
                       f"algo.rollout_rs_hi, both set; got lo={lo!r}, hi={hi!r}")
    _traced(hparams, algo, "rollout_rs_lo", "rollout_rs_hi")
  _traced(hparams, algo, "rollout_rs_veto", "rollout_rs_k3")
  return dict(rollout_is=rollout_is,
              is_floor=rollout_is is not None and algo["rollout_is_floor"] is not None,
              is_batch_norm=bool(algo["rollout_is_batch_norm"]), rollout_rs=rollout_rs,
              rs_veto=algo["rollout_rs_veto"] is not None,
              rs_k3=algo["rollout_rs_k3"] is not None)


def _token_selection(algo, hparams, per_sequence) -> Dict[str, Any]:
  """8.3 (the objective's ``cov_sel``) and 8.4 (the entropy keep mask)."""
  cov_select = algo["policy_loss"] if algo["policy_loss"] in ("clip_cov", "kl_cov") else None
  if cov_select == "clip_cov":
    if not algo["clip_cov_lb"] < algo["clip_cov_ub"]:
      raise ValueError(f"algo.clip_cov_lb={algo['clip_cov_lb']!r} must be < "
                       f"algo.clip_cov_ub={algo['clip_cov_ub']!r}")
    _traced(hparams, algo, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")
  elif cov_select == "kl_cov":
    _traced(hparams, algo, "kl_cov_ratio")
  entropy_mask = algo["entropy_top_rho"] < 1.0
  if entropy_mask:
    if algo["entropy_mask_source"] != "old":
      raise ValueError(f"algo.entropy_mask_source={algo['entropy_mask_source']!r} is not "
                       "supported: only 'old' (H_old of the scoring forward, one threshold per "
                       "minibatch, micro-batch invariant); 'current' (TRL's per-micro-batch "
                       "threshold from the loss forward) is not implemented")
    if per_sequence:
      raise ValueError(f"algo.entropy_top_rho masks per-token losses; algo.policy_loss="
                       f"{algo['policy_loss']!r} has one loss per sequence")
    _traced(hparams, algo, "entropy_top_rho")
  return dict(cov_select=cov_select, entropy_mask=entropy_mask)


def _entropy_ctrl_and_advantages(algo, hparams) -> Dict[str, Any]:
  """8.7 (the controller), 8.6 (the distillation term), 8.5 / 8.8 (their metrics, the loop)."""
  if algo["entropy_ctrl"]:
    if not algo["entropy_coef_min"] <= algo["entropy_coef_max"]:
      raise ValueError(f"algo.entropy_coef_min={algo['entropy_coef_min']!r} must be <= "
                       f"algo.entropy_coef_max={algo['entropy_coef_max']!r}")
    _traced(hparams, algo, "entropy_target", "entropy_coef_delta", "entropy_coef_min",
            "entropy_coef_max")
  opd = algo["opd_coef"] > 0
  if opd:
    _traced(hparams, algo, "opd_coef", "opd_discount")
  passk_k = None
  if algo["advantage"] == "passk":
    passk_k = algo["passk_k"]
    if passk_k is None:
      raise ValueError("algo.advantage='passk' needs algo.passk_k (an integer in [1, "
                       "rollout.group_size]); it has no default")
  return dict(entropy_ctrl=bool(algo["entropy_ctrl"]),
              entropy_ctrl_estimate=algo["entropy_ctrl_estimate"], opd=opd,
              opd_length_norm=bool(algo["opd_length_norm"]),
              opd_student_logp=algo["opd_student_logp"], passk_k=passk_k,
              remax=algo["advantage"] == "remax")


# --- applied by the trainer ----------------------------------------------------------------------

Scalars = Dict[str, chex.Array]


def correct_rollout(tf: Transforms, hp, old_logp: chex.Array, sampler_logp: chex.Array,
                    loss_mask: chex.Array) -> Tuple[chex.Array, Optional[chex.Array], Scalars]:
  """8.2 on a scored batch: ``(loss_mask after rejection, IS weights or None, metrics)``.

  Rejection first, then the weights over the kept tokens (rejected tokens stay out of the batch
  normalisation). Group statistics of the advantages already include the rejected rows (verl).
  """
  metrics: Scalars = {}
  if tf.rejection:
    loss_mask, metrics = correction.rollout_rejection_mask(
        old_logp, sampler_logp, loss_mask, level=tf.rollout_rs,
        lo=hp.get("rollout_rs_lo"), hi=hp.get("rollout_rs_hi"),
        veto=hp.get("rollout_rs_veto"), k3=hp.get("rollout_rs_k3"))
  weights = None
  if tf.rollout_is is not None:
    weights, is_metrics = correction.rollout_is_weights(
        old_logp, sampler_logp, loss_mask, level=tf.rollout_is, cap=hp["rollout_is_cap"],
        floor=hp.get("rollout_is_floor") if tf.is_floor else None,
        batch_norm=tf.is_batch_norm)
    metrics.update(is_metrics)
  return loss_mask, weights, metrics


def minibatch_selection(tf: Transforms, hp, uniforms: Optional[chex.Array],
                        old_logp: chex.Array, advantages: chex.Array, mask: chex.Array,
                        old_entropy: Optional[chex.Array]
                        ) -> Tuple[Optional[chex.Array], Optional[chex.Array], Metrics]:
  """8.3 / 8.4 over one whole optimizer minibatch: ``(cov_sel, entropy keep, metrics)`` as
  float 0/1 masks ``[B, T]`` (None when off). ``uniforms`` from ``cov.selection_uniforms``."""
  sel = keep = None
  metrics: Metrics = {}
  if tf.cov_select == "clip_cov":
    sel, metrics = cov.clip_cov_select(old_logp, advantages, mask, uniforms,
                                       ratio=hp["clip_cov_ratio"], lb=hp["clip_cov_lb"],
                                       ub=hp["clip_cov_ub"])
  elif tf.cov_select == "kl_cov":
    sel, metrics = cov.kl_cov_select(old_logp, advantages, mask, ratio=hp["kl_cov_ratio"])
  if tf.entropy_mask:
    keep, keep_metrics = entropy.entropy_keep_mask(old_entropy, mask, rho=hp["entropy_top_rho"])
    metrics = dict(metrics, **keep_metrics)
  as_float = lambda x: None if x is None else x.astype(mask.dtype)
  return as_float(sel), as_float(keep), metrics


def entropy_ctrl_update(hp, state: entropy.EntropyCtrlState, measured_sum: chex.Array,
                        measured_count: chex.Array) -> Tuple[entropy.EntropyCtrlState, Scalars]:
  """8.7 after an RL step: the controller stepped with the step's measured entropy (a step
  without a valid token keeps the state); ``entropy_ctrl/`` metrics of the step."""
  measured = measured_sum / jnp.maximum(measured_count, 1)
  stepped = entropy.entropy_ctrl_step(
      state, measured, target=hp["entropy_target"], delta=hp["entropy_coef_delta"],
      coef_min=hp["entropy_coef_min"], coef_max=hp["entropy_coef_max"])
  new = entropy.EntropyCtrlState(*(jnp.where(measured_count > 0, a, b)
                                   for a, b in zip(stepped, state)))
  # ``applied``: the coefficient this step trained with (alpha_k); ``coef``: the new state c.
  metrics = {"entropy_ctrl/coef": new.coef, "entropy_ctrl/applied": state.applied,
             "entropy_ctrl/measured": measured,
             "entropy_ctrl/active": (state.applied > 0).astype(new.coef.dtype)}
  return new, metrics

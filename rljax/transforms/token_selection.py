"""Token selections fixed per optimizer minibatch, before it is split into micro-batches (so the
split cannot change them): Clip-Cov / KL-Cov's covariance selection (docs/algorithms.md, read by
their objectives as ``cov_sel``) and the 80/20 high-entropy keep mask (8.4, multiplying the
policy loss, restricting the entropy bonus)."""
from rljax.algos import cov, entropy
from rljax.transforms.base import (Transform, per_sequence_objective, register_transform,
                                   traced)


@register_transform("cov_selection", order=70,
                    reads=("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio"))
def make_cov(algo, hparams):
  """Clip-Cov / KL-Cov's token selection (Cui et al., arXiv 2505.22617), with
  ``algo.policy_loss='clip_cov'`` or ``'kl_cov'``: computed once per optimizer minibatch over all
  its valid tokens from ``old_logp``, ``A`` and seeded uniforms, before the minibatch is split
  into micro-batches (so the split cannot change it), and passed to the objective as ``cov_sel``."""
  objective = algo["policy_loss"]
  if objective == "clip_cov":
    if not algo["clip_cov_lb"] < algo["clip_cov_ub"]:
      raise ValueError(f"algo.clip_cov_lb={algo['clip_cov_lb']!r} must be < "
                       f"algo.clip_cov_ub={algo['clip_cov_ub']!r}")
    keys = traced(hparams, algo, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")
  elif objective == "kl_cov":
    keys = traced(hparams, algo, "kl_cov_ratio")
  else:
    return None

  def on_minibatch(mb):
    """Clip-Cov's uniforms from ``fold_in(fold_in(PRNGKey(seed), step), index)``."""
    r, hp = mb.rollout, mb.hp
    if objective == "clip_cov":
      uniforms = cov.selection_uniforms(mb.seed, mb.step, mb.index, r.loss_mask.shape)
      sel, metrics = cov.clip_cov_select(r.old_logp, r.advantages, r.loss_mask, uniforms,
                                         ratio=hp["clip_cov_ratio"], lb=hp["clip_cov_lb"],
                                         ub=hp["clip_cov_ub"])
    else:
      sel, metrics = cov.kl_cov_select(r.old_logp, r.advantages, r.loss_mask,
                                       ratio=hp["kl_cov_ratio"])
    return {"cov_sel": sel.astype(r.loss_mask.dtype)}, metrics

  return Transform("cov_selection", keys=keys, needs_old_logp=True, on_minibatch=on_minibatch)


@register_transform("entropy_mask", order=80,
                    reads=("entropy_top_rho", "entropy_mask_source"))
def make_entropy_mask(algo, hparams):
  """The 80/20 high-entropy mask (Wang et al., arXiv 2506.01939), with
  ``algo.entropy_top_rho < 1``: only the top-``rho`` highest-entropy tokens of each optimizer
  minibatch (``H_old`` of the scoring forward) train, ``l <- keep l`` with ``m`` unchanged (so
  ``token_mean`` still divides by every valid token); the entropy bonus averages over
  ``m keep``; KL is not masked."""
  if not algo["entropy_top_rho"] < 1.0:
    return None
  if algo["entropy_mask_source"] != "old":
    raise ValueError(f"algo.entropy_mask_source={algo['entropy_mask_source']!r} is not "
                     "supported: only 'old' (H_old of the scoring forward, one threshold per "
                     "minibatch, micro-batch invariant); 'current' (TRL's per-micro-batch "
                     "threshold from the loss forward) is not implemented")
  if per_sequence_objective(algo):
    raise ValueError(f"algo.entropy_top_rho masks per-token losses; algo.policy_loss="
                     f"{algo['policy_loss']!r} has one loss per sequence")
  keys = ("entropy_mask_source",) + traced(hparams, algo, "entropy_top_rho")

  def on_score(view):  # H_old of the scoring forward, kept for the minibatches
    return {"extras": {"old_entropy": view.entropy}}, {}

  def on_minibatch(mb):
    r = mb.rollout
    keep, metrics = entropy.entropy_keep_mask(r.extras["old_entropy"], r.loss_mask,
                                              rho=mb.hp["entropy_top_rho"])
    return {"entropy_keep": keep.astype(r.loss_mask.dtype)}, metrics

  return Transform("entropy_mask", keys=keys, needs_old_logp=True, loss_weight="entropy_keep",
                   on_score=on_score, on_minibatch=on_minibatch)

"""The KL coefficient beta as state: fixed, or adaptive towards ``algo.kl_target`` (Ziegler et
al., arXiv 1909.08593; docs/algorithms.md section 8). On whenever there is a KL term."""
import jax.numpy as jnp

from rljax.algos import kl as kl_lib
from rljax.algos.losses import token_metrics
from rljax.transforms.base import Transform, register_transform
from rljax.algos.losses import scalar_metric


@register_transform("kl_coef", order=10, reads=("kl_coef", "kl_target", "kl_horizon"))
def make(algo, hparams):
  """The KL coefficient ``beta`` as state, on whenever there is a KL term
  (``algo.kl_placement != 'none'``): fixed at ``algo.kl_coef``, or, with ``algo.kl_target`` set,
  adaptive (Ziegler et al., arXiv 1909.08593): after each RL step
  ``beta <- beta (1 + clip(KL / target - 1, -0.2, 0.2) n / horizon)``, ``KL`` the token-mean
  estimate of the batch (``old_logp`` vs ``ref_logp``) and ``n`` its rows. Logs ``kl_coef``."""
  if algo["kl_placement"] == "none":
    return None
  target, estimator = algo["kl_target"], algo["kl_estimator"]
  horizon = float(algo["kl_horizon"])

  def on_step(state, hp, batch, metrics):
    coef = state["coef"]
    if target is not None:
      kl_sum, kl_count = token_metrics(
          batch.loss_mask, v=kl_lib.kl_estimate(estimator, batch.old_logp, batch.ref_logp))["v"]
      coef = kl_lib.adaptive_kl_coef(coef, kl_sum / jnp.maximum(kl_count, 1.0), target=target,
                                     horizon=horizon, n=batch.loss_mask.shape[0])
    return {"coef": coef}, {"kl_coef": scalar_metric(coef)}

  return Transform(
      "kl_coef", keys=("kl_coef",) + (() if target is None else ("kl_target", "kl_horizon")),
      needs_old_logp=target is not None,
      init=lambda: {"coef": jnp.asarray(algo["kl_coef"], jnp.float32)},
      coefs=lambda state: {"kl_coef": state["coef"]}, on_step=on_step)

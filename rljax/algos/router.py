"""The mixture-of-experts router's load-balancing loss as a regulariser.

Switch Transformer (Fedus et al. 2021, arXiv 2101.03961, eq. 4-6), as ``transformers`` adds it
to Qwen3-MoE's loss: ``L_aux = E * sum_e f_e P_e`` with ``f_e`` the fraction of (token, choice)
pairs routed to expert ``e`` and ``P_e`` its mean router probability over the valid tokens
(``rljax.models.moe.load_balancing_loss``), averaged over the MoE layers of the forward.
"""
import chex

from rljax.algos.registry import register_regularizer


@register_regularizer("router_balance", coef="router_aux_coef", agg="token_mean",
                      enabled=lambda algo: algo["router_aux_coef"] is not None)
def router_balance(router_aux: chex.Array) -> chex.Array:
  """Switch Transformer's load balance (Fedus et al., arXiv 2101.03961): ``L_aux = E sum_e f_e
  P_e``, ``f_e`` the share of routed (token, choice) pairs and ``P_e`` the mean router
  probability of expert ``e``, averaged over the MoE layers.

  ``L_aux`` of the micro-batch's policy forward on each of its tokens ``[B, T]``: its token
  mean is ``L_aux``, so the update adds ``router_aux_coef * L_aux`` (``algo.router_aux_coef``;
  the trainer sets the checkpoint's ``router_aux_loss_coef`` when it is None)."""
  return router_aux

"""Registry entries of ALGORITHMS.md section 8 (8.0: policy objectives ``sapo``, ``clip_cov``,
``kl_cov``; advantage estimators ``passk``, ``passk_n``, ``remax``).

Each entry is the pure function of its module, its hyperparameters mapped to ``algo.*`` keys.
Inputs beyond the standard ones, which the trainer must put in the batch under these names:

* ``clip_cov`` / ``kl_cov``: ``cov_sel[B, T]``, computed once per optimizer minibatch (over all
  its valid tokens, before splitting into micro-batches) by ``cov.clip_cov_select(old_logp,
  advantages, mask, uniforms, ratio=algo.clip_cov_ratio, lb=algo.clip_cov_lb,
  ub=algo.clip_cov_ub)`` with ``uniforms = cov.selection_uniforms(seed, step, minibatch, shape)``,
  or ``cov.kl_cov_select(old_logp, advantages, mask, ratio=algo.kl_cov_ratio)``.
* ``remax``: ``remax_baseline[P]``, the reward of one greedy completion per prompt.

Config keys these entries read (to add to the ``algo`` section with these defaults, 8.1-8.8):
``sapo_tau_pos`` 1.0, ``sapo_tau_neg`` 1.05, ``sapo_level`` 'token'; ``kl_cov_coef`` 1.0
(``clip_cov`` reuses ``clip_eps_low``/``clip_eps_high``, its preset 1.0); ``passk_k`` (required,
no default: None is refused naming the key); ``passk_n`` reuses ``adv_std`` ('group' | 'none').
The selections also read ``clip_cov_ratio`` 2e-4, ``clip_cov_lb`` 1.0, ``clip_cov_ub`` 5.0,
``kl_cov_ratio`` 2e-3.

The rollout correction (8.2), the entropy mask (8.4), on-policy distillation (8.6) and the
entropy controller (8.7) are transforms with their own keys, not registry entries.
"""
from rljax.algos import cov, passk, remax, sapo
from rljax.algos.registry import register_advantage, register_policy_loss

SAPO_LEVELS = ("token", "sequence")


@register_policy_loss("sapo", hparams={"tau_pos": "sapo_tau_pos", "tau_neg": "sapo_tau_neg",
                                       "level": "sapo_level"},
                      loss_agg="seq_mean_token_mean")
def sapo_objective(logp, old_logp, advantages, mask, *, tau_pos, tau_neg, level):
  """SAPO (arXiv 2511.20347) at ``algo.sapo_level``: the token gate on ``r`` or the sequence gate
  on GSPO's ``s_i``; aggregation forced to ``seq_mean_token_mean`` (verl, TRL)."""
  if level == "token":
    return sapo.sapo_loss(logp, old_logp, advantages, mask, tau_pos=tau_pos, tau_neg=tau_neg)
  if level == "sequence":
    return sapo.sapo_sequence_loss(logp, old_logp, advantages, mask, tau_pos=tau_pos,
                                   tau_neg=tau_neg)
  raise ValueError(f"algo.sapo_level must be one of {SAPO_LEVELS}, got {level!r}")


register_policy_loss("clip_cov", hparams={"eps_low": "clip_eps_low",
                                          "eps_high": "clip_eps_high"})(cov.clip_cov_loss)
register_policy_loss("kl_cov", hparams={"coef": "kl_cov_coef"})(cov.kl_cov_loss)
register_advantage("passk", hparams={"k": "passk_k"})(passk.passk_advantages)
register_advantage("passk_n", hparams={"std_mode": "adv_std"})(passk.passk_n_advantages)
register_advantage("remax", min_group_size=1)(remax.remax_advantages)

"""The RL components of docs/algorithms.md as small pure functions, registered by name.

``configs/algos/<algo>.py`` picks the names; ``rljax.algorithm.resolve(config)`` looks them up once
and returns an ``Algorithm`` whose methods the trainer (or a notebook) calls:

  algo = resolve(config)
  algo.advantages(rewards=..., mask=..., values=None, token_rewards=None) -> (A, returns)
  algo.policy_loss_sum(logp=..., old_logp=..., advantages=..., mask=...) -> (sum, metrics)
  algo.policy_loss_count(mask)
  algo.regularizers: KL in the loss, entropy bonus, positive-example LM loss, ...
  value_loss_sum(values, old_values, returns, mask, clip=...) / value_loss_count(mask)

A new component is one decorated function (``register_advantage``, ``register_policy_loss``,
``register_regularizer``) in a module of this package: its positional parameters name the arrays
it reads, its keyword-only ones the ``algo.*`` hyperparameters. Every module of the package is
imported the first time a component registry is read (``rljax.registries``), so a component
registers itself by existing: none is listed by hand.
"""
from rljax.algos.registry import (ADVANTAGES, KL_ESTIMATORS, LOSS_AGGS, POLICY_LOSSES,
                                  REGULARIZERS, Registry, UnknownNameError, list_registries,
                                  register_advantage, register_kl_estimator, register_loss_agg,
                                  register_policy_loss, register_regularizer)
from rljax.algos.advantages import (discounted_returns, dr_grpo_advantages, gae_advantages,
                                    gae_estimator, gae_returns, gpg_advantages, grpo_advantages,
                                    length_adaptive_lam, opo_advantages, outcome_token_rewards,
                                    reinforce_pp_advantages, reinforce_pp_baseline_advantages,
                                    rloo_advantages, sequence_lengths, to_groups, whiten)
from rljax.algos.losses import (SEQUENCE_MEAN, agg_count, agg_sum, cispo_loss, entropy_bonus,
                                gmpo_loss, gspo_loss, log_ratio, pg_loss, ppo_clip_loss,
                                ppo_loss, safe_mean, token_level_agg, token_metrics,
                                truncated_is_weights)
from rljax.algos.kl import (adaptive_kl_coef, ema_update, k1, k2, k3, k3_plus, kl_estimate,
                            kl_penalty, kl_reward_penalty, kl_reward_tokens)
from rljax.algos.value import (explained_variance, positive_example_rows, positive_lm_nll,
                               positive_rows_mask, value_loss_count, value_loss_sum)
from rljax.algos.correction import mismatch_metrics
from rljax.algos.logprobs import (entropy_from_logits, logprobs_from_logits,
                                  token_logprobs_and_entropy)

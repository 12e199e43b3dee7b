"""The RL components of ALGORITHMS.md as small pure functions, registered by name.

``configs/<algo>.py`` picks the names; the trainer calls the dispatchers:

  compute_advantages(algo_cfg, *, rewards, mask, group_size, values=None, token_rewards=None)
  policy_loss_sum(algo_cfg, *, logp, old_logp, advantages, mask, sampler_logp=None)
  policy_loss_count(algo_cfg, mask)
  kl_loss_sum(algo_cfg, *, logp, ref_logp, mask) / kl_loss_count(algo_cfg, mask)
  value_loss_sum(values, old_values, returns, mask, *, clip) / value_loss_count(mask)
"""
from rljax.algos.registry import (ADVANTAGES, KL_ESTIMATORS, LOSS_AGGS, POLICY_LOSSES, Registry,
                                  UnknownNameError, list_registries, register_advantage,
                                  register_kl_estimator, register_loss_agg, register_policy_loss)
from rljax.algos.advantages import (compute_advantages, discounted_returns, dr_grpo_advantages,
                                    gae_advantages, gae_returns, gpg_advantages, grpo_advantages,
                                    length_adaptive_lam, opo_advantages, outcome_token_rewards,
                                    reinforce_pp_advantages, reinforce_pp_baseline_advantages,
                                    rloo_advantages, sequence_lengths, to_groups, whiten)
from rljax.algos.losses import (SEQUENCE_MEAN, agg_count, agg_sum, aggregate, cispo_loss,
                                gmpo_loss, gspo_loss, log_ratio, pg_loss, policy_loss_agg,
                                policy_loss_count, policy_loss_sum, ppo_clip_loss, ppo_loss,
                                regularizer_loss_agg, safe_mean, sequence_mean_sum, token_metrics,
                                truncated_is_weights)
from rljax.algos.kl import (adaptive_kl_coef, ema_update, k1, k2, k3, k3_plus, kl_estimate,
                            kl_loss_agg, kl_loss_count, kl_loss_sum, kl_placement,
                            kl_reward_tokens, ref_update)
from rljax.algos.value import (explained_variance, positive_example_rows, positive_lm_loss_count,
                               positive_lm_loss_sum, value_loss_count, value_loss_sum)
from rljax.algos.logprobs import (entropy_from_logits, logprobs_from_logits,
                                  token_logprobs_and_entropy)

"""The compiled part of an RL step: scoring a rollout, and the train_step.

``prepare_batch`` runs one forward of each model (policy -> old log-probs, reference -> ref
log-probs, critic -> values), then shaping and advantages, all in one jit; with one optimizer
update per batch the policy's forward is left to the loss, whose own forward gives the same
log-probs. ``train_step`` runs ``algo.epochs x algo.minibatches`` optimizer updates inside
``lax.scan``, each accumulating gradients over ``algo.micro_batches`` with exact ``(sum, count)``
aggregation: every loss term's denominator is computed once over the whole minibatch, so how the
minibatch is split never changes the gradient. Both are jitted with explicit shardings by ``compile_step_fns``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from rljax import algos
from rljax.algos import kl as kl_lib
from rljax.algos import losses as loss_lib
from rljax.algos import value as value_lib
from rljax.models import ModelConfig, llama
from rljax.rewards import shaping
from rljax.train.state import TrainBatch, TrainState

Metrics = dict  # name -> (sum, count)


def completion_stats(model_cfg: ModelConfig, params, tokens, attn_mask, num_completion: int,
                     chunk: int):
  """Log-probs and entropies of the completion tokens ``tokens[:, S-T:]``: ([B, T], [B, T]).

  The hidden state at position ``s`` predicts token ``s+1``; logits are built in sequence
  chunks, never as a [B, T, V] array.
  """
  s = tokens.shape[1]
  model = llama.bind(model_cfg, params)
  hidden, _ = model(tokens, llama.positions_from_mask(attn_mask), attn_mask=attn_mask)
  hidden = hidden[:, s - num_completion - 1:s - 1]
  return algos.token_logprobs_and_entropy(hidden, model.head_weight(),
                                          tokens[:, s - num_completion:], chunk=chunk)


def completion_values(model_cfg: ModelConfig, critic_params, tokens, attn_mask,
                      num_completion: int):
  """``V[i, t]``: the critic's value of the state before completion token t, [B, T]."""
  s = tokens.shape[1]
  model = llama.bind(model_cfg, critic_params, head="value")
  hidden, _ = model(tokens, llama.positions_from_mask(attn_mask), attn_mask=attn_mask)
  return model.values(hidden[:, s - num_completion - 1:s - 1])


def _sum_metrics(a: Metrics, b: Metrics) -> Metrics:
  return jax.tree.map(jnp.add, a, b)


def _scalar_metric(x) -> tuple:
  return (jnp.asarray(x, jnp.float32), jnp.ones((), jnp.float32))


@dataclasses.dataclass(frozen=True)
class StepFns:
  prepare_batch: Callable
  train_step: Callable
  critic_step: Callable | None
  prepare_batch_mc: Callable | None = None  # prepare_batch with lam_critic=1 (value pretraining)


def check_update_schedule(config) -> None:
  """Raises a ``ValueError`` naming the keys when the update schedule cannot run:
  ``rollout.prompts_per_step``, ``rollout.group_size``, ``algo.epochs``, ``algo.minibatches`` and
  ``algo.micro_batches`` must be at least 1, and the ``P x G`` rows of a step must split into
  ``minibatches x micro_batches`` equal parts."""
  algo, r = config.algo, config.rollout
  for section, key in (("rollout", "prompts_per_step"), ("rollout", "group_size"),
                       ("algo", "epochs"), ("algo", "minibatches"), ("algo", "micro_batches")):
    value = config[section][key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{section}.{key}={value!r} must be an integer >= 1")
  rows = r.prompts_per_step * r.group_size
  if rows % (algo.minibatches * algo.micro_batches):
    raise ValueError(
        f"rollout.prompts_per_step x rollout.group_size = {rows} rows do not split into "
        f"algo.minibatches={algo.minibatches} x algo.micro_batches={algo.micro_batches} equal "
        "parts")


def build_step_fns(config, model_cfg: ModelConfig, actor_tx: optax.GradientTransformation,
                   critic_tx: optax.GradientTransformation | None) -> StepFns:
  """Pure (unjitted) prepare_batch / train_step / critic_step closed over the configuration."""
  check_update_schedule(config)
  algo = config.algo
  group_size = config.rollout.group_size
  chunk = config.model.logits_chunk
  placement = kl_lib.kl_placement(algo) or "none"
  has_critic = config.critic.enabled
  value_clip = config.critic.value_clip
  # One optimizer update per batch (epochs = minibatches = micro_batches = 1) starts from the
  # policy that scored the batch: its old log-probs are the ones the loss computes anyway (ratio
  # 1, gradient that of logp), so prepare_batch skips the policy forward and the loss reports the
  # metrics that forward gave. Not when the old log-probs are needed before the update (KL in the
  # reward, the adaptive KL coefficient) or the loss sees another mask (overlong filter).
  reuse_policy_forward = (algo.epochs == 1 and algo.minibatches == 1 and algo.micro_batches == 1
                          and placement != "reward" and algo.kl_target is None
                          and not algo.overlong_filter)

  def scoring_metrics(mask, logp, entropy, sampler_logp, ref_logp) -> Metrics:
    """Entropy, the sampler / policy log-prob gap and the KL estimate over the valid tokens."""
    gap = jnp.abs(logp - sampler_logp)
    metrics = {
        "entropy": loss_lib.token_metrics(mask, entropy=entropy)["entropy"],
        "logp_gap_mean": loss_lib.token_metrics(mask, gap=gap)["gap"],
        "logp_gap_max": _scalar_metric(jax.lax.stop_gradient(jnp.where(mask > 0, gap, 0).max())),
    }
    if placement != "none":
      metrics["kl"] = loss_lib.token_metrics(
          mask, kl=kl_lib.kl_estimate(algo.kl_estimator, logp, ref_logp))["kl"]
    return metrics

  # --- scoring ---------------------------------------------------------------------------------

  def prepare_batch(state: TrainState, rollout_tokens, rollout_attn, completion_mask,
                    sampler_logp, rewards, truncated, row_valid):
    """Rollout arrays (on device) -> (TrainBatch, metrics).

    rollout_tokens/rollout_attn [B, S]; completion_mask, sampler_logp [B, T]; rewards [B] after
    shaping; truncated, row_valid [B] (row_valid = 0 on dynamic-sampling padding rows).
    """
    num_completion = completion_mask.shape[1]
    mask = completion_mask.astype(jnp.float32) * row_valid.astype(jnp.float32)[:, None]
    zeros = jnp.zeros(mask.shape, jnp.float32)
    if reuse_policy_forward:
      old_logp = entropy = None  # the train_step's forward gives them
    else:
      old_logp, entropy = completion_stats(model_cfg, state.params, rollout_tokens, rollout_attn,
                                           num_completion, chunk)
    if state.ref_params is not None:
      ref_logp, _ = completion_stats(model_cfg, state.ref_params, rollout_tokens, rollout_attn,
                                     num_completion, chunk)
    else:
      ref_logp = zeros
    if has_critic:
      values = completion_values(model_cfg, state.critic_params, rollout_tokens, rollout_attn,
                                 num_completion)
    else:
      values = zeros
    if placement == "reward":
      token_rewards = kl_lib.kl_reward_tokens(rewards, mask, old_logp, ref_logp,
                                              kl_coef=state.kl_coef,
                                              estimator=algo.kl_estimator)
    else:
      token_rewards = algos.outcome_token_rewards(rewards, mask)
    advantages, returns = algos.compute_advantages(
        algo, rewards=rewards, mask=mask, group_size=group_size,
        values=values if has_critic else None, token_rewards=token_rewards)
    if returns is None:
      returns = jnp.zeros_like(advantages)
    loss_mask = shaping.overlong_filter_mask(mask, truncated) if algo.overlong_filter else mask
    metrics = {"advantage_mean": loss_lib.token_metrics(loss_mask, a=advantages)["a"]}
    if not reuse_policy_forward:
      metrics.update(scoring_metrics(mask, old_logp, entropy, sampler_logp, ref_logp))
    if has_critic:
      # How much of the return variance the critic explained before this update.
      metrics["explained_variance"] = _scalar_metric(
          value_lib.explained_variance(values, returns, mask))
    batch = TrainBatch(
        tokens=rollout_tokens, attn_mask=rollout_attn, mask=loss_mask,
        old_logp=zeros if reuse_policy_forward else old_logp, ref_logp=ref_logp,
        sampler_logp=sampler_logp,
        advantages=advantages, returns=returns, old_values=values,
        positive=value_lib.positive_example_rows(
            jnp.where(row_valid > 0, rewards, rewards.min())).astype(jnp.float32)
        * row_valid.astype(jnp.float32))
    return batch, metrics

  # --- losses ----------------------------------------------------------------------------------

  def actor_loss(params, kl_coef, micro: TrainBatch, counts):
    num_completion = micro.mask.shape[1]
    logp, entropy = completion_stats(model_cfg, params, micro.tokens, micro.attn_mask,
                                     num_completion, chunk)
    old_logp = jax.lax.stop_gradient(logp) if reuse_policy_forward else micro.old_logp
    loss_sum, metrics = algos.policy_loss_sum(
        algo, logp=logp, old_logp=old_logp, advantages=micro.advantages, mask=micro.mask,
        sampler_logp=micro.sampler_logp if algo.tis_cap is not None else None)
    total = loss_sum / counts["policy"]
    metrics = dict(metrics)
    if reuse_policy_forward:  # the metrics prepare_batch left out, from the same forward
      metrics.update(scoring_metrics(micro.mask, jax.lax.stop_gradient(logp), entropy,
                                     micro.sampler_logp, micro.ref_logp))
    metrics["policy_loss"] = (loss_sum, counts["policy"] / counts["micro"])
    if placement == "loss":
      kl_sum, kl_metrics = kl_lib.kl_loss_sum(algo, logp=logp, ref_logp=micro.ref_logp,
                                              mask=micro.mask)
      total = total + kl_coef * kl_sum / counts["kl"]
      metrics["kl_loss"] = (kl_sum, counts["kl"] / counts["micro"])
    reg_mode = loss_lib.regularizer_loss_agg(algo)
    if algo.entropy_coef:
      ent_sum = loss_lib.agg_sum(reg_mode, entropy, micro.mask, algo.loss_norm_constant)
      total = total - algo.entropy_coef * ent_sum / counts["entropy"]
    if algo.pos_lm_coef:
      pos_sum = value_lib.positive_lm_loss_sum(logp, micro.mask, micro.positive)
      total = total + algo.pos_lm_coef * pos_sum / counts["positive"]
      metrics["pos_lm_loss"] = (pos_sum, counts["positive"] / counts["micro"])
    return total, metrics

  def critic_loss(critic_params, micro: TrainBatch, counts):
    values = completion_values(model_cfg, critic_params, micro.tokens, micro.attn_mask,
                               micro.mask.shape[1])
    loss_sum, metrics = value_lib.value_loss_sum(values, micro.old_values, micro.returns,
                                                 micro.mask, clip=value_clip)
    metrics = dict(metrics)
    metrics["value_loss"] = (loss_sum, counts["value"] / counts["micro"])
    return loss_sum / counts["value"], metrics

  def minibatch_counts(mb: TrainBatch, micro_batches: int):
    one = jnp.ones((), jnp.float32)
    reg_mode = loss_lib.regularizer_loss_agg(algo)
    # Clamped at 1: an empty minibatch (all padding) contributes a zero loss, not NaN.
    counts = {
        "policy": algos.policy_loss_count(algo, mb.mask),
        "kl": kl_lib.kl_loss_count(algo, mb.mask),
        "entropy": loss_lib.agg_count(reg_mode, mb.mask),
        "positive": value_lib.positive_lm_loss_count(mb.mask, mb.positive),
        "value": value_lib.value_loss_count(mb.mask),
    }
    counts = {k: jnp.maximum(v.astype(jnp.float32), one) for k, v in counts.items()}
    counts["micro"] = jnp.asarray(micro_batches, jnp.float32)
    return counts

  def split_rows(tree, parts: int):
    """[N, ...] -> [parts, N/parts, ...], part j holding rows j, j+parts, ... (strided, so each
    part takes an equal share of every data-parallel shard)."""
    def split(x):
      n = x.shape[0]
      if n % parts:
        raise ValueError(f"{n} rows do not split into {parts} equal parts")
      return x.reshape((n // parts, parts) + x.shape[1:]).swapaxes(0, 1)
    return jax.tree.map(split, tree)

  def accumulate(loss_fn, params, mb: TrainBatch, counts, *extra):
    """Sum of gradients and metrics over micro-batches (scan)."""
    micro = split_rows(mb, algo.micro_batches)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def body(acc, mi):
      (loss, metrics), grads = grad_fn(params, *extra, mi, counts)
      new = (jax.tree.map(jnp.add, acc[0], grads), acc[1] + loss, _sum_metrics(acc[2], metrics))
      return new, None

    zero_grads = jax.tree.map(jnp.zeros_like, params)
    first = jax.tree.map(lambda x: x[0], micro)
    metrics_shape = jax.eval_shape(grad_fn, params, *extra, first, counts)[0][1]
    zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metrics_shape)
    (grads, loss, metrics), _ = jax.lax.scan(body, (zero_grads, jnp.zeros(()), zero_metrics),
                                             micro)
    return loss, grads, metrics

  def apply_update(tx, params, opt_state, grads, loss):
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # A non-finite loss or gradient leaves params and optimizer state untouched.
    keep = lambda new, old: jnp.where(finite, new, old)
    return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state),
            grad_norm, finite)

  def minibatch_update(state: TrainState, mb: TrainBatch, update_actor: bool):
    counts = minibatch_counts(mb, algo.micro_batches)
    metrics = {}
    skipped = jnp.zeros((), jnp.int32)
    params, opt_state, ref_params = state.params, state.opt_state, state.ref_params
    if update_actor:
      loss, grads, actor_metrics = accumulate(actor_loss, state.params, mb, counts, state.kl_coef)
      params, opt_state, grad_norm, finite = apply_update(actor_tx, state.params,
                                                          state.opt_state, grads, loss)
      skipped = skipped + (~finite).astype(jnp.int32)
      metrics.update(actor_metrics)
      metrics["loss"] = _scalar_metric(loss)
      metrics["grad_norm"] = _scalar_metric(grad_norm)
      if ref_params is not None:
        ref_params = kl_lib.ref_update(algo, ref_params, params)
    critic_params, critic_opt_state = state.critic_params, state.critic_opt_state
    if has_critic:
      closs, cgrads, critic_metrics = accumulate(critic_loss, state.critic_params, mb, counts)
      critic_params, critic_opt_state, cgrad_norm, cfinite = apply_update(
          critic_tx, state.critic_params, state.critic_opt_state, cgrads, closs)
      skipped = skipped + (~cfinite).astype(jnp.int32)
      metrics.update(critic_metrics)
      metrics["critic_grad_norm"] = _scalar_metric(cgrad_norm)
    new_state = state.replace(params=params, opt_state=opt_state, ref_params=ref_params,
                              critic_params=critic_params, critic_opt_state=critic_opt_state,
                              skipped_updates=state.skipped_updates + skipped)
    return new_state, metrics

  def run_updates(state: TrainState, batch: TrainBatch, update_actor: bool):
    """epochs x minibatches updates; rows reshuffled each epoch from the state's key."""
    rng, shuffle_key = jax.random.split(state.rng)
    state = state.replace(rng=rng)
    n = batch.mask.shape[0]

    def epoch(state, key):
      order = jax.random.permutation(key, n) if algo.epochs * algo.minibatches > 1 \
          else jnp.arange(n)
      shuffled = jax.tree.map(lambda x: x[order], batch)
      return jax.lax.scan(lambda s, mb: minibatch_update(s, mb, update_actor), state,
                          split_rows(shuffled, algo.minibatches))

    state, metrics = jax.lax.scan(epoch, state, jax.random.split(shuffle_key, algo.epochs))
    metrics = jax.tree.map(lambda x: x.sum(axis=(0, 1)), metrics)
    return state, metrics

  def train_step(state: TrainState, batch: TrainBatch):
    state, metrics = run_updates(state, batch, update_actor=True)
    if placement != "none" and algo.kl_target is not None:
      kl_sum, kl_count = loss_lib.token_metrics(
          batch.mask, kl=kl_lib.kl_estimate(algo.kl_estimator, batch.old_logp,
                                            batch.ref_logp))["kl"]
      measured = kl_sum / jnp.maximum(kl_count, 1.0)
      state = state.replace(kl_coef=kl_lib.adaptive_kl_coef(
          state.kl_coef, measured, target=algo.kl_target, horizon=algo.kl_horizon,
          n=batch.mask.shape[0]))
    if placement != "none":
      metrics["kl_coef"] = _scalar_metric(state.kl_coef)
    return state.replace(step=state.step + 1), metrics

  def critic_step(state: TrainState, batch: TrainBatch):
    """Value pretraining: updates of the critic alone; the actor is not touched."""
    return run_updates(state, batch, update_actor=False)

  return StepFns(prepare_batch=prepare_batch, train_step=train_step,
                 critic_step=critic_step if has_critic else None)


def compile_step_fns(fns: StepFns, *, state_sharding, data_sharding, replicated) -> StepFns:
  """``jax.jit`` each function with explicit shardings; the state is donated to train_step.

  ``data_sharding(ndim)`` gives the sharding of a batch array (rows on the data axes).
  """
  batch_sh = TrainBatch(*(data_sharding(2),) * 9, data_sharding(1))
  rollout_in = (data_sharding(2),) * 4 + (data_sharding(1),) * 3
  # out_shardings: every TrainBatch field leaves on the row sharding train_step expects, also
  # the ones XLA would otherwise replicate (zeros for returns / values without a critic).
  prepare = jax.jit(fns.prepare_batch, in_shardings=(state_sharding,) + rollout_in,
                    out_shardings=(batch_sh, replicated))
  prepare_mc = None
  if fns.prepare_batch_mc is not None:
    prepare_mc = jax.jit(fns.prepare_batch_mc, in_shardings=(state_sharding,) + rollout_in,
                         out_shardings=(batch_sh, replicated))
  train = jax.jit(fns.train_step, in_shardings=(state_sharding, batch_sh),
                  out_shardings=(state_sharding, replicated), donate_argnums=0)
  critic = None
  if fns.critic_step is not None:
    critic = jax.jit(fns.critic_step, in_shardings=(state_sharding, batch_sh),
                     out_shardings=(state_sharding, replicated), donate_argnums=0)
  return StepFns(prepare_batch=prepare, train_step=train, critic_step=critic,
                 prepare_batch_mc=prepare_mc)

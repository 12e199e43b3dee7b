"""The compiled part of an RL step: scoring a rollout, and the train_step.

``score`` runs one forward of each model (policy -> old log-probs, reference -> ref log-probs,
critic -> values), then the advantages, and returns the same ``Rollout`` record with those
fields filled. With one optimizer update per batch the policy's forward is left to the loss,
whose own forward gives the same log-probs (``old_logp`` stays None). ``train_step`` runs
``epochs x minibatches`` optimizer updates (``rljax.train.update``), each accumulating gradients
over micro-batches with exact ``(sum, count)`` aggregation. The algorithm comes in resolved
(``rljax.algos.resolve``) and its float hyperparameters as a traced ``hp`` dict.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from rljax import algos
from rljax.algos import losses as loss_lib
from rljax.algos import value as value_lib
from rljax.algos.resolve import Algorithm
from rljax.models import ModelConfig, llama
from rljax.rewards import shaping
from rljax.rollout.sampler import Rollout
from rljax.train import update as update_lib
from rljax.train.state import TrainState
from rljax.train.update import scalar_metric

Metrics = dict  # name -> (sum, count)


def sequence_inputs(rollout: Rollout):
  """Prompt + completion ``tokens`` and ``attn_mask`` ``[B, S]`` for a teacher-forced forward."""
  tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1).astype(jnp.int32)
  attn = jnp.concatenate([rollout.prompt_mask, rollout.mask], axis=1).astype(jnp.int32)
  return tokens, attn


def completion_stats(model_cfg: ModelConfig, params, rollout: Rollout, chunk: int):
  """Log-probs and entropies of the completion tokens under ``params``: ([B, T], [B, T]).

  The hidden state at position ``s`` predicts token ``s+1``; logits are built in sequence
  chunks, never as a [B, T, V] array.
  """
  tokens, attn = sequence_inputs(rollout)
  s, t = tokens.shape[1], rollout.tokens.shape[1]
  model = llama.bind(model_cfg, params)
  hidden, _ = model(tokens, llama.positions_from_mask(attn), attn_mask=attn)
  return algos.token_logprobs_and_entropy(hidden[:, s - t - 1:s - 1], model.head_weight(),
                                          tokens[:, s - t:], chunk=chunk)


def completion_values(model_cfg: ModelConfig, critic_params, rollout: Rollout):
  """``V[i, t]``: the critic's value of the state before completion token t, [B, T]."""
  tokens, attn = sequence_inputs(rollout)
  s, t = tokens.shape[1], rollout.tokens.shape[1]
  model = llama.bind(model_cfg, critic_params, head="value")
  hidden, _ = model(tokens, llama.positions_from_mask(attn), attn_mask=attn)
  return model.values(hidden[:, s - t - 1:s - 1])


@dataclasses.dataclass(frozen=True)
class Learner:
  """What the compiled step closes over: the resolved algorithm, the architecture, the
  optimizers. ``reuse_policy_forward``: one optimizer update per batch, so the loss's forward
  gives the old log-probs (ratio 1) and scoring skips the policy forward; not when the old
  log-probs are needed before the update (KL in the reward, the adaptive KL coefficient) or the
  loss sees another mask (overlong filter)."""
  algo: Algorithm
  model_cfg: ModelConfig
  actor_tx: optax.GradientTransformation
  critic_tx: optax.GradientTransformation | None
  logits_chunk: int
  critic_clip: float | None = None  # critic.value_clip

  @property
  def reuse_policy_forward(self) -> bool:
    a = self.algo
    return (a.epochs == a.minibatches == a.micro_batches == 1 and a.kl_placement != "reward"
            and a.kl_target is None and not a.overlong_filter)


# --- scoring -------------------------------------------------------------------------------------

def scoring_metrics(learner: Learner, mask, logp, entropy, sampler_logp, ref_logp) -> Metrics:
  """Entropy, the sampler / policy log-prob gap and the KL estimate over the valid tokens."""
  gap = jnp.abs(logp - sampler_logp)
  metrics = {
      "entropy": loss_lib.token_metrics(mask, v=entropy)["v"],
      "logp_gap_mean": loss_lib.token_metrics(mask, v=gap)["v"],
      "logp_gap_max": scalar_metric(jax.lax.stop_gradient(jnp.where(mask > 0, gap, 0).max())),
  }
  if ref_logp is not None:
    metrics["kl"] = loss_lib.token_metrics(mask, v=learner.algo.kl(logp, ref_logp))["v"]
  return metrics


def score(learner: Learner, state: TrainState, rollout: Rollout, hp) -> tuple[Rollout, Metrics]:
  """A rollout with rewards -> the same record with ``loss_mask``, ``old_logp`` (None when the
  loss provides it), ``ref_logp``, ``values``, ``returns``, ``advantages`` and ``positive``."""
  algo, cfg, chunk = learner.algo, learner.model_cfg, learner.logits_chunk
  row_valid = rollout.row_valid.astype(jnp.float32)
  mask = rollout.mask.astype(jnp.float32) * row_valid[:, None]
  old_logp = entropy = ref_logp = values = token_rewards = None
  if not learner.reuse_policy_forward:
    old_logp, entropy = completion_stats(cfg, state.params, rollout, chunk)
  if state.ref_params is not None:
    ref_logp, _ = completion_stats(cfg, state.ref_params, rollout, chunk)
  if state.critic_params is not None:
    values = completion_values(cfg, state.critic_params, rollout)
  if algo.kl_placement == "reward":
    token_rewards = algos.kl_reward_tokens(rollout.rewards, mask, old_logp, ref_logp,
                                           kl_coef=state.kl_coef, estimator=algo.kl_estimator)
  advantages, returns = algo.advantages(rewards=rollout.rewards, mask=mask, values=values,
                                        token_rewards=token_rewards, hp=hp)
  loss_mask = shaping.overlong_filter_mask(mask, rollout.truncated) if algo.overlong_filter \
      else mask
  metrics = {"advantage_mean": loss_lib.token_metrics(loss_mask, v=advantages)["v"]}
  if old_logp is not None:
    metrics.update(scoring_metrics(learner, mask, old_logp, entropy, rollout.sampler_logp,
                                   ref_logp))
  if values is not None:
    # How much of the return variance the critic explained before this update.
    metrics["explained_variance"] = scalar_metric(
        value_lib.explained_variance(values, returns, mask))
  positive = value_lib.positive_example_rows(
      jnp.where(row_valid > 0, rollout.rewards, rollout.rewards.min())).astype(jnp.float32)
  scored = rollout.replace(loss_mask=loss_mask, old_logp=old_logp, ref_logp=ref_logp,
                           values=values, returns=returns, advantages=advantages,
                           positive=positive * row_valid)
  return scored, metrics


# --- losses --------------------------------------------------------------------------------------

def _loss_inputs(batch: Rollout) -> dict:
  """The arrays a component may read by name, for the tokens the losses see."""
  return dict(mask=batch.loss_mask, advantages=batch.advantages, old_logp=batch.old_logp,
              sampler_logp=batch.sampler_logp, ref_logp=batch.ref_logp, positive=batch.positive,
              rewards=batch.rewards)


def minibatch_counts(learner: Learner, minibatch: Rollout) -> dict:
  """The denominator of every loss term over the whole minibatch (clamped at 1: an all-padding
  minibatch contributes a zero loss, not NaN)."""
  algo, arrays = learner.algo, _loss_inputs(minibatch)
  counts = {"policy": algo.policy_loss_count(minibatch.loss_mask),
            "value": value_lib.value_loss_count(minibatch.loss_mask)}
  counts.update({reg.name: reg.count(**arrays) for reg in algo.regularizers})
  counts = {k: jnp.maximum(v.astype(jnp.float32), 1.0) for k, v in counts.items()}
  counts["micro"] = jnp.asarray(algo.micro_batches, jnp.float32)
  return counts


def actor_loss(learner: Learner, params, coefs, micro: Rollout, counts):
  """The policy objective plus every regulariser, each divided by its minibatch count."""
  algo = learner.algo
  logp, entropy = completion_stats(learner.model_cfg, params, micro, learner.logits_chunk)
  arrays = _loss_inputs(micro)
  if micro.old_logp is None:
    arrays["old_logp"] = jax.lax.stop_gradient(logp)
  arrays.update(logp=logp, entropy=entropy)
  loss_sum, metrics = algo.policy_loss_sum(hp=coefs, **arrays)
  total = loss_sum / counts["policy"]
  metrics = dict(metrics, policy_loss=(loss_sum, counts["policy"] / counts["micro"]))
  if micro.old_logp is None:  # the metrics scoring left out, from the same forward
    metrics.update(scoring_metrics(learner, micro.loss_mask, arrays["old_logp"], entropy,
                                   micro.sampler_logp, micro.ref_logp))
  for reg in algo.regularizers:
    reg_sum = algo.regularizer_sum(reg, coefs, **arrays)
    total = total + coefs[reg.coef] * reg_sum / counts[reg.name]
    metrics[f"{reg.name}_loss"] = (reg_sum, counts[reg.name] / counts["micro"])
  return total, metrics


def critic_loss(learner: Learner, critic_params, micro: Rollout, counts):
  values = completion_values(learner.model_cfg, critic_params, micro)
  loss_sum, metrics = value_lib.value_loss_sum(values, micro.values, micro.returns,
                                               micro.loss_mask, clip=learner.critic_clip)
  metrics = dict(metrics, value_loss=(loss_sum, counts["value"] / counts["micro"]))
  return loss_sum / counts["value"], metrics


# --- updates -------------------------------------------------------------------------------------

def minibatch_update(learner: Learner, hp, state: TrainState, minibatch: Rollout, *,
                     update_actor: bool):
  """One optimizer step of the actor (and of the critic when there is one) on a minibatch."""
  algo = learner.algo
  counts = minibatch_counts(learner, minibatch)
  metrics, skipped = {}, jnp.zeros((), jnp.int32)
  if update_actor:
    coefs = dict(hp, kl_coef=state.kl_coef)  # the adaptive KL coefficient lives in the state
    loss, grads, actor_metrics = update_lib.accumulate_gradients(
        lambda p, mb, c: actor_loss(learner, p, coefs, mb, c), state.params, minibatch, counts,
        parts=algo.micro_batches)
    params, opt_state, grad_norm, applied = update_lib.apply_update(
        learner.actor_tx, state.params, state.opt_state, grads, loss)
    ref_params = state.ref_params
    if ref_params is not None:
      ref_params = algo.ref_update(ref_params, params, hp)
    state = state.replace(params=params, opt_state=opt_state, ref_params=ref_params)
    skipped += (~applied).astype(jnp.int32)
    metrics.update(actor_metrics, loss=scalar_metric(loss), grad_norm=scalar_metric(grad_norm))
  if state.critic_params is not None:
    closs, cgrads, critic_metrics = update_lib.accumulate_gradients(
        lambda p, mb, c: critic_loss(learner, p, mb, c), state.critic_params, minibatch,
        counts, parts=algo.micro_batches)
    critic_params, critic_opt_state, cgrad_norm, capplied = update_lib.apply_update(
        learner.critic_tx, state.critic_params, state.critic_opt_state, cgrads, closs)
    state = state.replace(critic_params=critic_params, critic_opt_state=critic_opt_state)
    skipped += (~capplied).astype(jnp.int32)
    metrics.update(critic_metrics, critic_grad_norm=scalar_metric(cgrad_norm))
  metrics["update_skipped"] = scalar_metric(skipped > 0)
  return state.replace(skipped_updates=state.skipped_updates + skipped), metrics


def _updates(learner: Learner, state: TrainState, batch: Rollout, hp, update_actor: bool):
  rng, shuffle_key = jax.random.split(state.rng)
  return update_lib.run_epochs(
      lambda s, mb: minibatch_update(learner, hp, s, mb, update_actor=update_actor),
      state.replace(rng=rng), batch, shuffle_key, epochs=learner.algo.epochs,
      minibatches=learner.algo.minibatches)


def train_step(learner: Learner, state: TrainState, batch: Rollout, hp):
  """``epochs x minibatches`` updates on a scored batch, then the adaptive KL coefficient."""
  algo = learner.algo
  state, metrics = _updates(learner, state, batch, hp, update_actor=True)
  if algo.kl_placement is not None and algo.kl_target is not None:
    kl_sum, kl_count = loss_lib.token_metrics(
        batch.loss_mask, v=algo.kl(batch.old_logp, batch.ref_logp))["v"]
    state = state.replace(kl_coef=algos.adaptive_kl_coef(
        state.kl_coef, kl_sum / jnp.maximum(kl_count, 1.0), target=algo.kl_target,
        horizon=algo.kl_horizon, n=batch.loss_mask.shape[0]))
  if algo.kl_placement is not None:
    metrics["kl_coef"] = scalar_metric(state.kl_coef)
  return state.replace(step=state.step + 1), metrics


def critic_step(learner: Learner, state: TrainState, batch: Rollout, hp):
  """Value pretraining: updates of the critic alone; the actor is not touched."""
  return _updates(learner, state, batch, hp, update_actor=False)


# --- compiled entry points -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepFns:
  """``score(state, rollout, hp)``, ``train_step(state, batch, hp)`` and, with a critic,
  ``critic_step`` and ``score_mc`` (scoring with Monte-Carlo returns, for value pretraining)."""
  score: Callable
  train_step: Callable
  critic_step: Callable | None = None
  score_mc: Callable | None = None


def step_fns(learner: Learner, mc_learner: Learner | None = None) -> StepFns:
  """The pure (unjitted) step functions of ``learner``."""
  has_critic = learner.critic_tx is not None
  return StepFns(
      score=lambda state, rollout, hp: score(learner, state, rollout, hp),
      train_step=lambda state, batch, hp: train_step(learner, state, batch, hp),
      critic_step=(lambda state, batch, hp: critic_step(learner, state, batch, hp))
      if has_critic else None,
      score_mc=(lambda state, rollout, hp: score(mc_learner, state, rollout, hp))
      if mc_learner is not None else None)


class _RowSharded:
  """``jax.jit`` of ``fn(state, rollout, hp)`` whose rollout shardings come from the record's
  fields (rows on the data axes, whatever fields are present): compiled once per structure."""

  def __init__(self, fn, *, state_sharding, rows: Callable, replicated, donate: bool):
    self._fn, self._state, self._rows, self._rep = fn, state_sharding, rows, replicated
    self._donate = donate
    self._compiled: dict = {}

  def __call__(self, state, rollout, hp):
    treedef = jax.tree.structure(rollout)
    jitted = self._compiled.get(treedef)
    if jitted is None:
      out_state, _ = jax.eval_shape(self._fn, state, rollout, hp)
      out_first = self._state if isinstance(out_state, TrainState) else self._rows(out_state)
      jitted = self._compiled[treedef] = jax.jit(
          self._fn, in_shardings=(self._state, self._rows(rollout), self._rep),
          out_shardings=(out_first, self._rep), donate_argnums=(0,) if self._donate else ())
    return jitted(state, rollout, hp)


def compile_step_fns(fns: StepFns, *, state_sharding, rows: Callable, replicated) -> StepFns:
  """``jax.jit`` each function with explicit shardings; the state is donated to the updates.

  ``rows(tree)`` gives the row shardings of a record's arrays.
  """
  def jit(fn, donate):
    return None if fn is None else _RowSharded(fn, state_sharding=state_sharding, rows=rows,
                                               replicated=replicated, donate=donate)
  return StepFns(score=jit(fns.score, False), train_step=jit(fns.train_step, True),
                 critic_step=jit(fns.critic_step, True), score_mc=jit(fns.score_mc, False))


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

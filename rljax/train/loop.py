"""The RL loop: prompts -> rollout -> rewards -> shaping -> filter -> score -> train_step.

Only what cannot be compiled lives here: verifiers (Python), dynamic-sampling decisions,
metrics, checkpoints. One ``Rollout`` record travels from the sampler through the host (rewards,
validity) into scoring and the update. Every random draw comes from ``fold_in(PRNGKey(seed),
step, round)`` or the checkpointed ``TrainState.rng``, so a resumed run replays exactly the steps
it has not done.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

from rljax import models
from rljax.parallel import distributed, rules
from rljax.envs.checks import check_env_startup
from rljax.rewards import sources as reward_sources
from rljax.rollout import speculative
from rljax.rollout.sampler import Rollout
from rljax.train import actors, build, evaluation, filters, generation
from rljax.runs import compilation_cache
from rljax.runs import preemption
from rljax.train import rlhf
from rljax.runs import run_dir as run_dir_lib
from rljax.runs.metrics import summarize
from rljax.transforms import HostRollout
from rljax.models import attention

# --- rollout and rewards -------------------------------------------------------------------------

def transform_rollout(run: build.Run, part: Rollout, problems, key,
                      params=None) -> tuple[Rollout, dict]:
  """Every transform's host hook on a sampled round (ReMax's greedy baseline, pass@k's check):
  the round with their extras, and their counts (summed over rounds). ``params``: the weights
  that sampled the round (default: the train state's)."""
  params = run.state.params if params is None else params
  sample = lambda problems, key, sampling, group_size: generation.generate(
      run.generator, params, problems, key, sampling, group_size)[0]
  counts = {}
  for t in run.algo.transforms:
    if t.on_rollout is not None:
      part, info = t.on_rollout(HostRollout(part, problems, key, run.sampling,
                                            run.config.rollout.group_size, sample))
      counts.update(info)
  return part, counts


def check_step(run: build.Run, metrics: dict, step: int) -> None:
  """Every transform's host check of a step's metrics (a non-finite teacher stops the run)."""
  for t in run.algo.transforms:
    if t.check_step is not None:
      t.check_step(metrics, step)


def collect_batch(run: build.Run, step: int, stream: int = 0,
                  params=None, newest=None) -> tuple[Rollout, dict]:
  """P groups of G completions; with dynamic sampling, only groups with a reward spread.

  DAPO (arXiv 2503.14476): oversample rounds of P prompts until P groups are kept or
  ``algo.max_gen_batches`` rounds ran; the excess is trimmed, a shortfall is padded with
  zero-weight rows (and logged) so that the compiled step keeps its shapes. ``params``: the
  sampler's weights (default: the train state's, on a colocated sampler); ``newest``: with
  in-flight weight updates, ``() -> (version, weights)`` read between a rollout's chunks.
  """
  cfg = run.config
  params = run.state.params if params is None else params
  num_prompts, group_size = cfg.rollout.prompts_per_step, cfg.rollout.group_size
  # stream 0: RL steps; stream 1: value pretraining rollouts.
  base = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(cfg.seed), stream), step)
  kept, rounds, seen_groups, all_rounds, verifier_counts = [], 0, 0, [], []
  max_rounds = cfg.algo.max_gen_batches if cfg.algo.dynamic_sampling else 1
  while rounds < max_rounds:
    problems = run.source.next_batch(num_prompts)
    key = jax.random.fold_in(base, rounds)
    part, _, counts = generation.generate(run.generator, params, problems, key, run.sampling,
                                          group_size, newest=newest)
    part, transform_counts = transform_rollout(run, part, problems, key, params)
    run.source.observe(problems, part.correct)
    verifier_counts.append({**counts, **transform_counts})
    rounds += 1
    seen_groups += num_prompts
    all_rounds.append(part)
    if not cfg.algo.dynamic_sampling:
      kept.append(part)
      break
    keep = filters.group_keep_mask(part.correct, part.rewards, group_size,
                                   cfg.algo.keep_pass_rate)
    if keep.any():
      kept.append(filters.take_groups(part, np.flatnonzero(keep), group_size))
    if sum(k.num_rows for k in kept) >= num_prompts * group_size:
      break
  generated = filters.concat_groups(all_rounds)
  # Each source's raw scores are logged here, over every row generated, and not sent on.
  source_means = reward_sources.source_means(generated.extras)
  spec = _draft_metrics(generated, run.config)  # read before the counts are stripped
  # The acceptance counts too: logged here, never sent to the update.
  strip = lambda part: part.replace(extras=speculative.without_counts(
      reward_sources.without_source_values(part.extras)))
  generated, kept = strip(generated), [strip(k) for k in kept]
  if kept:
    batch = filters.pad_groups(filters.concat_groups(kept), num_prompts, group_size)
  else:  # nothing had a spread: a batch of zero-weight rows keeps the step's shape
    batch = filters.take_groups(generated, np.arange(num_prompts), group_size)
    batch = batch.replace(row_valid=np.zeros_like(batch.row_valid))
  info = {
      "gen_rounds": rounds,
      "kept_group_frac": float(sum(k.num_rows for k in kept) / group_size / seen_groups),
      "valid_group_frac": float(batch.row_valid.mean()),
      # Rollout statistics are over everything generated, before filtering.
      "reward_mean": float(generated.rewards.mean()),
      "reward_std": float(generated.rewards.std()),
      "accuracy": float(generated.correct.mean()),
      "len_mean": float(generated.lengths.mean()),
      "len_max": float(generated.lengths.max()),
      "truncation_rate": float(generated.truncated.mean()),
      "generated_tokens": float(generated.lengths.sum()),
      "generated_samples": float(generated.num_rows),
  }
  info.update({k: sum(c[k] for c in verifier_counts) for k in verifier_counts[0]})
  info.update(source_means)
  info.update(spec)
  info.update(run.source.end_step())
  info["data/dropped_prompts"] = float(run.source.dropped_prompts)
  info["data/invalid_rows"] = float(run.source.invalid_rows)
  for name, rows in (("correct", generated.correct), ("wrong", ~generated.correct)):
    if rows.any():  # response lengths by outcome (Dr. GRPO's length bias shows in the wrong ones)
      info[f"len_{name}_mean"] = float(generated.lengths[rows].mean())
  info.update(episode_means(info))
  if "token_version" in generated.extras:
    info.update(token_staleness(generated.extras["token_version"], step))
  return batch, info


def _draft_metrics(generated, cfg) -> dict:
  """``rollout/draft_accept_rate`` and ``rollout/tokens_per_verify`` of a speculative rollout
  (``rollout.draft``; ``speculative.acceptance_metrics``), over every row generated; {} without
  speculation."""
  extras = generated.extras
  if speculative.STAT_VERIFIES not in extras:
    return {}
  m = speculative.acceptance_metrics(extras[speculative.STAT_VERIFIES],
                                     extras[speculative.STAT_ACCEPTED], generated.lengths,
                                     cfg.rollout.draft_tokens)
  return {f"rollout/{k}": v for k, v in m.items()}


def token_staleness(version, step: int) -> dict:
  """Learner steps between step ``step`` and the weights that drew each token of an in-flight
  rollout (``extras['token_version']``, -1 on padding): mean and max over its tokens."""
  lag = step - np.asarray(version)[np.asarray(version) >= 0]
  if not lag.size:
    return {}
  return {"async/token_staleness_mean": float(lag.mean()),
          "async/token_staleness_max": float(lag.max())}


def episode_means(counts: dict) -> dict:
  """Per-episode means of a multi-turn batch's ``env/*`` sums (none for single-turn ones)."""
  episodes = counts.get("env/episodes")
  if not episodes:
    return {}
  return {f"env/{name}_per_episode": counts[f"env/{name}"] / episodes
          for name in ("turns", "tool_calls", "tool_errors")}


def eval_metrics(result: dict) -> dict:
  """The metrics of an eval: ``eval_accuracy`` (pass@1), ``sec_eval`` (its wall seconds), and for
  multi-turn rollouts turns, tool calls and tool errors per episode and the share of episodes
  with a tool call."""
  return {"eval_accuracy": result["pass@1"], "sec_eval": result["sec"],
          **_episode_metrics(result, "eval_")}


def _episode_metrics(result: dict, prefix: str) -> dict:
  return {f"{prefix}{k}": v for k, v in result.items() if k in evaluation.EPISODE_METRICS}


def to_device(rollout: Rollout, mesh) -> Rollout:
  """A host rollout (identical on every process) -> row-sharded device arrays, each process
  placing its own rows; the shardings follow from the record's fields."""
  return distributed.from_host(rollout, rules.batch_shardings(mesh, rollout))


# --- the loop ------------------------------------------------------------------------------------

def pretrain_critic(run: build.Run, place: Callable = lambda params: params) -> None:
  """Value pretraining (VC-PPO arXiv 2503.01491, VAPO arXiv 2504.05118): ``critic.pretrain_steps``
  critic-only updates on Monte-Carlo returns (lam = 1) of rollouts from the fixed initial policy.
  ``place(params)``: the policy's weights where the sampler reads them (default: the train
  state's own), taken again after every update: the critic step donates the train state, the
  unchanged policy weights included, so a colocated sampler's weights from before it are gone."""
  cfg = run.config
  for i in range(cfg.critic.pretrain_steps):
    batch, info = collect_batch(run, step=i, stream=1, params=place(run.state.params))
    scored, _ = run.fns.score_mc(run.state, to_device(batch, run.mesh), run.algo.hparams,
                                 *run.aux_args)
    run.state, metrics = run.fns.critic_step(run.state, scored, run.algo.hparams)
    values = summarize(distributed.to_host(metrics))
    run.writer.log(f"value pretraining {i + 1}/{cfg.critic.pretrain_steps}: "
                   f"value_loss={values.get('value_loss', float('nan')):.4f}")
    run.writer.write_named("pretrain", i, values)


def train(config) -> dict:
  """Run ``config`` end to end; returns the final eval and the last step's metrics. SIGTERM and
  SIGINT end it with ``preemption.Stop`` (SIGTERM after saving the last step)."""
  prepared = build.prepare(config)  # every check that needs no run dir, before claiming it
  check_env_startup(config, prepared.tokenizer)
  rlhf.check_start(config)  # the RLHF demo's cold start can write where it will
  # The cache is set once the run dir is claimed and before anything is compiled (the SFT cold
  # start included). The run dir is claimed before the RLHF demo's reward model is trained, so
  # a run stopped then is resumed (train.resume=True) as well as rerun.
  grace_s = config.train.preempt_grace_s
  with models.matmul_precision(config.model), run_dir_lib.claimed(config), \
      compilation_cache.persistent(compilation_cache.run_cache_dir(config)), \
      preemption.preemptible(config.train.run_dir, grace_s,
                             after=lambda: actors.join_stopped(grace_s)) as guard:
    with guard.droppable():  # the cold starts inside are blocks of their own (not droppable)
      rlhf.prepare_reward_model(config)  # the RLHF demo's pairs and reward model, made first
      run = build.build_run(config, prepared)
    guard.attach(save=_saver(run), close=lambda: _close(run))
    return _train(run, guard)


def _saver(run: build.Run):
  """How a preemption saves the run's state at a step (None: the run keeps no checkpoints)."""
  if run.checkpointer is None:
    return None
  return lambda step, extra: run.checkpointer.save(step, run.state, extra, force=True)


def _close(run: build.Run) -> None:
  """Complete pending saves (never left half-written) and close the metrics."""
  if run.checkpointer is not None:
    run.checkpointer.close()
  run.writer.close()


def describe_model(model_cfg) -> str:
  """One start-up line: the family, its size and the kernels it will run with."""
  kernel = attention.resolve_backend(model_cfg.attention, dtype=model_cfg.dtype,
                                     self_attention=True)
  moe = (f", {model_cfg.num_experts} experts top-{model_cfg.experts_per_token} in "
         f"{len(model_cfg.moe_layers)} layers ({model_cfg.moe_dispatch} dispatch, router replay "
         f"{model_cfg.router_replay})" if model_cfg.moe_layers else "")
  return (f"model: {model_cfg.model_type}, {model_cfg.num_params() / 1e6:.2f}M parameters, "
          f"compute {model_cfg.dtype}, params {model_cfg.param_dtype}; attention "
          f"{model_cfg.attention} -> {kernel} on {jax.default_backend()}{moe}")


def _episodes(result: dict) -> str:
  """', 2.1 turns, 0.93 tool calls, 0.01 tool errors per episode' of a multi-turn eval."""
  if "turns" not in result:
    return ""
  return (f", {result['turns']:.2f} turns, {result['tool_calls']:.2f} tool calls, "
          f"{result['tool_errors']:.2f} tool errors per episode")


@dataclasses.dataclass
class RunLearner:
  """The learner of ``rljax.train.actors``: scores a batch on the learner's mesh and runs the
  train step on it, updating ``run.state``."""
  run: build.Run

  @property
  def params(self):
    return self.run.state.params

  def learn(self, batch: actors.Batch) -> dict:
    run = self.run
    scored, score_metrics = run.fns.score(run.state, to_device(batch.rollout, run.mesh),
                                          run.algo.hparams, *run.aux_args)
    run.state, metrics = run.fns.train_step(run.state, scored, run.algo.hparams)
    return summarize(distributed.to_host({**score_metrics, **metrics}))


def _train(run: build.Run, guard: preemption.Guard) -> dict:
  cfg = run.config
  start = int(distributed.to_host(run.state.step))
  eval_problems = run.source.eval_set(cfg.data.num_eval)
  place = lambda params: run.engine.transfer(params)[0]  # where the engine reads weights

  def evaluate(params) -> dict:
    t0 = time.perf_counter()
    result = evaluation.evaluate(run.generator, place(params), eval_problems,
                                 sampling=run.sampling, seed=cfg.seed)
    return {**result, "sec": time.perf_counter() - t0}

  result: dict = {}
  run.writer.log(describe_model(run.engine.model_cfg))
  run.writer.log(build.step_spec(cfg, run.model_cfg, run.algo, mesh=run.mesh).describe_packing(
      cfg.rollout.prompts_per_step * cfg.rollout.group_size,
      cfg.data.prompt_bucket + cfg.rollout.max_new_tokens))
  guard.at_step(start, None)  # checkpoint `start` exists, or start is 0: nothing to save
  if start == 0:
    with guard.droppable():
      initial = evaluate(run.state.params)
    run.writer.log(f"eval before training: accuracy {initial['pass@1']:.3f}{_episodes(initial)}")
    run.writer.write(0, eval_metrics(initial))
    result["eval_before"] = initial["pass@1"]
    result.update(_episode_metrics(initial, "eval_before_"))
    if run.fns.critic_step is not None and cfg.critic.pretrain_steps:
      with guard.droppable():  # the state at step 0 is never saved by a preemption
        pretrain_critic(run, place)
  staleness = cfg.rollout.max_staleness
  warning = actors.uncorrected_staleness_warning(
      staleness, corrected=run.algo.transform("rollout_correction") is not None
      or run.algo.old_logp == "sampler")
  if warning:
    run.writer.log(warning)
  # The data position of the state the learner holds: a checkpoint records this one, not the
  # position the sampler has drawn up to (actors.py: what a resumed run replays).
  consumed = run.source.state_dict()
  sampler = actors.make_batch_sampler(
      staleness, lambda step, params, newest: collect_batch(run, step, params=params,
                                                            newest=newest),
      run.source.state_dict, run.engine, run.state.params, start=start, steps=cfg.train.steps,
      inflight=bool(cfg.rollout.get("inflight_chunk", 0)))
  learner = RunLearner(run)
  try:
    last = _steps(run, guard, sampler, learner, start, consumed, evaluate)
  except BaseException:
    sampler.close(wait=False)  # train() saves (SIGTERM) first, then waits for the thread
    raise
  sampler.close()
  with guard.droppable():
    final = evaluate(run.state.params)
  run.writer.write(cfg.train.steps, eval_metrics(final))
  run.writer.log(f"eval after training: accuracy {final['pass@1']:.3f}{_episodes(final)}")
  result.update(eval_after=final["pass@1"], last=last, state=run.state)
  result.update(_episode_metrics(final, "eval_after_"))
  build.finish(run)
  return result


def _steps(run: build.Run, guard: preemption.Guard, sampler: actors.BatchSampler,
           learner: actors.Learner, start: int, consumed: dict, evaluate) -> dict:
  """Steps ``start .. train.steps``: the sampler's batch, the learner's update, the new weights
  back to the sampler; metrics, evals and checkpoints. Returns the last step's metrics."""
  cfg = run.config
  last, skipped_in_a_row = {}, 0
  for step in range(start, cfg.train.steps):
    if step > start:
      guard.at_step(step, build.checkpoint_extra(run, consumed))
    t0 = time.perf_counter()
    with guard.droppable():  # the train state is untouched until the update
      batch = sampler.next(step)
    t1 = time.perf_counter()
    metrics = learner.learn(batch)
    consumed = batch.data
    sync_metrics = sampler.publish(learner.params, step + 1)
    t2 = time.perf_counter()
    info = batch.info
    metrics.update(info)
    if cfg.rollout.max_staleness:
      # The learner's wall time per step includes only its wait for the batch, not the
      # sampler's time, which overlapped the previous updates.
      # The data position after the batch: consecutive, each prompt once, also across a resume.
      metrics.update({"async/staleness": float(step - batch.version),
                      "async/wait_sec": t1 - t0, "async/queued": float(sampler.queued()),
                      "async/data_position": float(batch.data.get("position", -1))})
      metrics.update(sec_rollout=batch.sec_rollout, sec_update=t2 - t1, sec_step=t2 - t0,
                     tokens_per_sec=info["generated_tokens"] / max(t2 - t0, 1e-9))
    else:
      metrics.update(sec_rollout=t1 - t0, sec_update=t2 - t1, sec_step=t2 - t0,
                     tokens_per_sec=info["generated_tokens"] / max(t2 - t0, 1e-9))
    metrics.update(sync_metrics)
    metrics["skipped_updates"] = float(distributed.to_host(run.state.skipped_updates))
    done = step + 1
    if cfg.train.eval_every and done % cfg.train.eval_every == 0 and done < cfg.train.steps:
      with sampler.idle():
        metrics.update(eval_metrics(evaluate(run.state.params)))
    run.writer.write(done, metrics)
    last = metrics
    check_step(run, metrics, done)
    skipped_in_a_row = skipped_in_a_row + 1 if metrics.get("update_skipped", 0) >= 1 else 0
    if cfg.train.max_skipped_steps and skipped_in_a_row >= cfg.train.max_skipped_steps:
      raise FloatingPointError(
          f"every optimizer update of the last {skipped_in_a_row} steps was skipped (non-finite "
          f"loss, gradient or parameters; train.max_skipped_steps={cfg.train.max_skipped_steps});"
          f" stopped at step {done}, the parameters are those of the last good update")
    if run.checkpointer and cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0:
      run.checkpointer.save(done, run.state, build.checkpoint_extra(run, consumed))
  if cfg.train.steps > start:
    guard.at_step(cfg.train.steps, build.checkpoint_extra(run, consumed))
  return last

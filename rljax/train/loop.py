"""The RL loop: prompts -> rollout -> rewards -> shaping -> filter -> score -> train_step.

Only what cannot be compiled lives here: verifiers (Python), dynamic-sampling decisions,
metrics, checkpoints. Every random draw comes from ``fold_in(PRNGKey(seed), step, round)`` or the
checkpointed ``TrainState.rng``, so a resumed run replays exactly the steps it has not done.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from rljax import models
from rljax import rollout as rollout_lib
from rljax.parallel import distributed, rules
from rljax.rewards import shaping, verifiers
from rljax.train import build, filters
from rljax.train import run_dir as run_dir_lib
from rljax.train.checkpoint import Checkpointer
from rljax.train.metrics import MetricsWriter, summarize
from rljax.train.state import TrainState

_EVAL_BATCH = 128


@dataclasses.dataclass
class Run:
  """What one training run holds on to between steps (no logic lives here)."""
  config: Any
  model: build.LoadedModel
  tokenizer: Any
  source: Any
  task_verifier: Any
  mesh: Any
  fns: Any
  state: TrainState
  sampling: rollout_lib.SamplingParams
  writer: MetricsWriter
  checkpointer: Checkpointer | None


# --- rollout and rewards -------------------------------------------------------------------------

def rollout_round(run: Run, params, problems, key, sampling, group_size) -> filters.RolloutGroups:
  """Sample ``group_size`` completions per problem and score them on the host."""
  cfg = run.config
  prompt_ids = [run.tokenizer.encode_prompt(p.prompt) for p in problems]
  tokens, mask = rollout_lib.left_pad(prompt_ids, cfg.data.prompt_bucket,
                                      run.tokenizer.pad_id)
  # Every process holds the same prompts; each feeds its own rows of the global batch, and
  # every process gets all completions back (the verifiers see the whole batch).
  rows = rules.batch_sharding(run.mesh, 2)
  tokens, mask, key = distributed.from_host((tokens, mask, np.asarray(key)),
                                            (rows, rows, rules.replicated(run.mesh)))
  out = distributed.to_host(run.model.sample(params, tokens, mask, key, sampling, group_size))
  completions = [run.tokenizer.decode(row[:n]) for row, n in zip(out.tokens, out.lengths)]
  rows_problems = [p for p in problems for _ in range(group_size)]
  rewards, correct = run.task_verifier(completions, rows_problems)
  rewards = np.asarray(rewards, np.float32) + np.asarray(
      shaping.overlong_penalty(np.asarray(out.lengths), max_new_tokens=sampling.max_new_tokens,
                               overlong_buffer=cfg.reward.overlong_buffer,
                               overlong_penalty=cfg.reward.overlong_penalty), np.float32)
  return filters.RolloutGroups(
      prompt_tokens=np.asarray(out.prompt_tokens), prompt_mask=np.asarray(out.prompt_mask),
      tokens=np.asarray(out.tokens), mask=np.asarray(out.mask), logp=np.asarray(out.logp),
      lengths=np.asarray(out.lengths), truncated=np.asarray(out.truncated),
      rewards=rewards, correct=np.asarray(correct, bool),
      row_valid=np.ones(len(completions), np.float32), completions=completions)


def collect_batch(run: Run, step: int, stream: int = 0) -> tuple[filters.RolloutGroups, dict]:
  """P groups of G completions; with dynamic sampling, only groups with a reward spread.

  DAPO (arXiv 2503.14476): oversample rounds of P prompts until P groups are kept or
  ``algo.max_gen_batches`` rounds ran; the excess is trimmed, a shortfall is padded with
  zero-weight rows (and logged) so that the compiled step keeps its shapes.
  """
  cfg = run.config
  num_prompts, group_size = cfg.rollout.prompts_per_step, cfg.rollout.group_size
  # stream 0: RL steps; stream 1: value pretraining rollouts.
  base = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(cfg.seed), stream), step)
  kept, rounds, seen_groups, all_rounds = [], 0, 0, []
  max_rounds = cfg.algo.max_gen_batches if cfg.algo.dynamic_sampling else 1
  while rounds < max_rounds:
    problems = run.source.next_batch(num_prompts)
    part = rollout_round(run, run.state.params, problems, jax.random.fold_in(base, rounds),
                         run.sampling, group_size)
    rounds += 1
    seen_groups += num_prompts
    all_rounds.append(part)
    if not cfg.algo.dynamic_sampling:
      kept.append(part)
      break
    keep = filters.group_keep_mask(part.correct, part.rewards, group_size,
                                   cfg.algo.keep_pass_rate)
    if keep.any():
      kept.append(part.take_groups(np.flatnonzero(keep), group_size))
    if sum(k.num_rows for k in kept) >= num_prompts * group_size:
      break
  generated = filters.concat_groups(all_rounds)
  if kept:
    batch = filters.pad_groups(filters.concat_groups(kept), num_prompts, group_size)
  else:  # nothing had a spread: a batch of zero-weight rows keeps the step's shape
    batch = generated.take_groups(np.arange(num_prompts), group_size)
    batch.row_valid = np.zeros_like(batch.row_valid)
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
  }
  return batch, info


def device_batch(run: Run, batch: filters.RolloutGroups):
  """Host rollout groups -> the row-sharded arrays ``prepare_batch`` takes (prompt+completion
  concatenated). The host batch is identical on every process; each places its own rows."""
  tokens = np.concatenate([batch.prompt_tokens, batch.tokens], axis=1).astype(np.int32)
  attn = np.concatenate([batch.prompt_mask, batch.mask], axis=1).astype(np.int32)
  arrays = (tokens, attn, batch.mask.astype(np.float32), batch.logp.astype(np.float32),
            batch.rewards.astype(np.float32), batch.truncated.astype(np.float32),
            batch.row_valid.astype(np.float32))
  return distributed.from_host(arrays, tuple(rules.batch_sharding(run.mesh, x.ndim)
                                             for x in arrays))


# --- evaluation ----------------------------------------------------------------------------------

def evaluate(run: Run, params, problems, *, samples: int = 1, greedy: bool = True,
             key=None) -> dict:
  """Accuracy on ``problems``: pass@1 (greedy by default); with ``samples=k`` also pass@k and
  majority@k over k sampled completions per problem."""
  cfg = run.config
  sampling = dataclasses.replace(run.sampling, greedy=greedy)
  key = jax.random.PRNGKey(cfg.seed + 1) if key is None else key
  correct, answers = [], []
  # A multiple of the data-parallel width, so that every device decodes the same number of rows.
  divisor = rules.batch_divisor(run.mesh)
  width = min(_EVAL_BATCH, -(-len(problems) // divisor) * divisor)
  for start in range(0, len(problems), width):
    chunk = problems[start:start + width]
    # Pad the last chunk with repeats so every eval call has the same shape (one compilation).
    padded = chunk + [chunk[-1]] * (width - len(chunk))
    part = rollout_round(run, params, padded, jax.random.fold_in(key, start), sampling, samples)
    n = len(chunk) * samples
    correct.append(part.correct[:n])
    answers.extend(verifiers.final_answer(c) for c in part.completions[:n])
  correct = np.concatenate(correct).reshape(len(problems), samples)
  result = {"pass@1": float(correct[:, 0].mean()) if greedy else float(correct.mean())}
  if samples > 1:
    result[f"pass@{samples}"] = float(correct.any(axis=1).mean())
    votes = np.asarray(answers, dtype=object).reshape(len(problems), samples)
    majority_correct = []
    for row_votes, row_correct in zip(votes, correct):
      counts: dict = {}
      for a in row_votes:
        if a is not None:
          counts[a] = counts.get(a, 0) + 1
      if not counts:
        majority_correct.append(False)
        continue
      top = max(counts, key=counts.get)
      majority_correct.append(bool(row_correct[list(row_votes).index(top)]))
    result[f"maj@{samples}"] = float(np.mean(majority_correct))
  return result


# --- the loop ------------------------------------------------------------------------------------

def pretrain_critic(run: Run) -> None:
  """Value pretraining (VC-PPO arXiv 2503.01491, VAPO arXiv 2504.05118): ``critic.pretrain_steps``
  critic-only updates on Monte-Carlo returns (lam = 1) of rollouts from the fixed initial policy."""
  cfg = run.config
  for i in range(cfg.critic.pretrain_steps):
    batch, info = collect_batch(run, step=i, stream=1)
    prepared, _ = run.fns.prepare_batch_mc(run.state, *device_batch(run, batch))
    run.state, metrics = run.fns.critic_step(run.state, prepared)
    values = summarize(distributed.to_host(metrics))
    run.writer.log(f"value pretraining {i + 1}/{cfg.critic.pretrain_steps}: "
                   f"value_loss={values.get('value_loss', float('nan')):.4f}")
    run.writer.write_named("pretrain", i, values)


def train(config) -> dict:
  """Run ``config`` end to end; returns the final eval and the last step's metrics."""
  with models.matmul_precision(config.model), run_dir_lib.claimed(config):  # reliability: lock
    run = build.build_run(config)
    try:
      return _train(run)
    except BaseException:
      # Whatever stops the loop, checkpoints already started are completed, not left half-written.
      if run.checkpointer is not None:
        run.checkpointer.close()
      run.writer.close()
      raise


def _train(run: Run) -> dict:
  cfg = run.config
  start = int(distributed.to_host(run.state.step))
  eval_problems = run.source.eval_set(cfg.data.num_eval)
  result: dict = {}
  if start == 0:
    initial = evaluate(run, run.state.params, eval_problems)
    run.writer.log(f"eval before training: accuracy {initial['pass@1']:.3f}")
    run.writer.write(0, {"eval_accuracy": initial["pass@1"]})
    result["eval_before"] = initial["pass@1"]
    if run.fns.critic_step is not None and cfg.critic.pretrain_steps:
      pretrain_critic(run)
  last = {}
  for step in range(start, cfg.train.steps):
    t0 = time.perf_counter()
    batch, info = collect_batch(run, step)
    t1 = time.perf_counter()
    prepared, score_metrics = run.fns.prepare_batch(run.state, *device_batch(run, batch))
    run.state, metrics = run.fns.train_step(run.state, prepared)
    metrics = summarize(distributed.to_host({**score_metrics, **metrics}))
    t2 = time.perf_counter()
    metrics.update(info)
    metrics.update(sec_rollout=t1 - t0, sec_update=t2 - t1, sec_step=t2 - t0,
                   tokens_per_sec=info["generated_tokens"] / max(t2 - t0, 1e-9),
                   skipped_updates=float(distributed.to_host(run.state.skipped_updates)))
    done = step + 1
    if cfg.train.eval_every and done % cfg.train.eval_every == 0 and done < cfg.train.steps:
      metrics["eval_accuracy"] = evaluate(run, run.state.params, eval_problems)["pass@1"]
    run.writer.write(done, metrics)
    last = metrics
    if run.checkpointer and cfg.train.checkpoint_every and done % cfg.train.checkpoint_every == 0:
      run.checkpointer.save(done, run.state, build.checkpoint_extra(run))
  final = evaluate(run, run.state.params, eval_problems)
  run.writer.write(cfg.train.steps, {"eval_accuracy": final["pass@1"]})
  run.writer.log(f"eval after training: accuracy {final['pass@1']:.3f}")
  result.update(eval_after=final["pass@1"], last=last, state=run.state)
  build.finish(run)
  return result

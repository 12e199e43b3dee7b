"""``rljax eval``: pass@1, pass@k and majority@k on the eval split for any checkpoint.

The policy comes from ``model.source`` (a Hugging Face directory, the SFT cold start, ...) or from
the latest checkpoint of an rljax run directory (``--checkpoint RUN_DIR``).
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections
import numpy as np

from rljax.config import checks as config_checks
from rljax import models
from rljax.data import datasets, prompt_policy, tokenizer as tokenizer_lib
from rljax.envs.checks import check_env_startup
from rljax.rewards import checkers
from rljax.config.sources import ModelSource, run_config
from rljax.train import build, generation, startup
from rljax.loading import loader
from rljax.train.build import load_run_params
from rljax.runs.run_dir import RunDirError
from rljax.parallel import mesh as mesh_lib

EVAL_BATCH = 128  # problems per sampler call
# Multi-turn evals also report, per episode: turns, tool calls, tool errors, and the share of
# episodes with at least one tool call (``rljax.envs.episodes`` records them per row).
EPISODE_METRICS = ("turns", "tool_calls", "tool_errors", "tool_use")


# The model.* keys that ``eval --checkpoint`` takes from the eval's command line: how the sampler
# computes, not what the weights are. Every other model.* key (the family, the widths, the source,
# the parameter dtype, the training-only memory settings) is the checkpoint's, from its
# config.json; an override that contradicts it is refused.
EVAL_MODEL_SETTINGS = ("dtype", "attention", "attention_block", "matmul_precision",
                       "scan_layers", "moe_dispatch", "moe_capacity_factor")


def _plain(value):
  return json.loads(json.dumps(value.to_dict() if hasattr(value, "to_dict") else value))


def checkpoint_config(config, run_dir: str, overridden=()) -> ml_collections.ConfigDict:
  """The config of the run in ``run_dir`` (its config.json), with the ``EVAL_MODEL_SETTINGS``
  that the command line overrides (``overridden``: the ``--config.KEY`` names) taken from
  ``config``; any other ``model.*`` override whose value differs from the run's is an error."""
  saved = run_config(run_dir)
  loader.check_run_kind(ModelSource("run", run_dir), "lm", f"eval --checkpoint {run_dir}")
  for key in overridden:
    section, _, name = key.partition(".")
    if section != "model" or not name:
      continue
    wanted, have = _plain(config.model[name]), _plain(saved.model.get(name))
    if wanted == have:
      continue
    if name in EVAL_MODEL_SETTINGS:
      with saved.unlocked():
        saved.model[name] = config.model[name]
      continue
    raise RunDirError(
        f"eval --checkpoint {run_dir}: --config.{key}={wanted!r} contradicts the checkpoint "
        f"(its config.json has {key}={have!r}): the model is the checkpoint's; drop the override "
        f"(an eval of a checkpoint sets only model.{{{', '.join(EVAL_MODEL_SETTINGS)}}})")
  return saved


def evaluate_config(config, *, samples: int = 1, checkpoint: str | None = None,
                    overridden=()) -> dict:
  """pass@1 (and with ``samples`` > 1 pass@k, maj@k) of ``model.source`` or of the latest
  checkpoint of the run dir ``checkpoint``; ``overridden``: the config keys the command line set
  (``checkpoint_config``: which ``model.*`` ones an eval of a checkpoint takes)."""
  run = checkpoint_config(config, checkpoint, overridden) if checkpoint else None
  with models.matmul_precision(config.model):
    return _evaluate_config(config, samples=samples, checkpoint=checkpoint, run=run)


def _evaluate_config(config, *, samples: int, checkpoint: str | None, run=None) -> dict:
  build.check_reward_fn(config)  # before minutes of loading, as train does
  config_checks.check_config(config)  # values, unread keys, relations: before any loading
  if checkpoint:
    loader.check_tokenizer(f"eval --checkpoint {checkpoint}", run_dir=checkpoint, config=config)
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  check_env_startup(config, tokenizer)
  if checkpoint:
    model_cfg, params = load_run_params(checkpoint, run)
  else:
    model_cfg, params = build.load_policy(config, tokenizer)
  source = datasets.make_prompt_source(config.data,
                                       takes_images=startup.takes_images(config, model_cfg))
  prompt_policy.apply_prompt_policy(source, config, tokenizer)
  engine = build.make_engine(config, model_cfg, mesh_lib.make_mesh(config.mesh), tokenizer)
  generator = build.make_generator(config, engine, tokenizer, source, task_only=True)
  sampling = build.sampling_params(config, tokenizer)
  problems = source.eval_set(config.data.num_eval)
  result = {"num_problems": len(problems)}
  result.update(evaluate(generator, params, problems, sampling=sampling, seed=config.seed))
  if samples > 1:
    sampled = evaluate(generator, params, problems, sampling=sampling, seed=config.seed,
                       samples=samples, greedy=False)
    result.update({k: v for k, v in sampled.items() if k != "pass@1"
                   and k not in EPISODE_METRICS})
    result["pass@1_sampled"] = sampled["pass@1"]
    result.update({f"{k}_sampled": sampled[k] for k in EPISODE_METRICS if k in sampled})
  return result


def evaluate(generator: generation.Generator, params, problems, *, sampling, seed: int,
             samples: int = 1, greedy: bool = True, key=None) -> dict:
  """Accuracy on ``problems``: pass@1 (greedy by default); with ``samples=k`` also pass@k and
  majority@k over k sampled completions per problem. Multi-turn rollouts (a multi-turn engine)
  add ``EPISODE_METRICS``, means over the episodes pass@1 is computed on, and have no
  majority@k (an episode has no one final answer to vote on)."""
  sampling = dataclasses.replace(sampling, greedy=greedy)
  key = jax.random.PRNGKey(seed + 1) if key is None else key
  correct, answers, episodes = [], [], []
  # A multiple of the engine's row multiple (the data-parallel width), so that every device
  # decodes the same number of rows.
  divisor = generator.engine.row_multiple
  width = min(EVAL_BATCH, -(-len(problems) // divisor) * divisor)
  for start in range(0, len(problems), width):
    chunk = problems[start:start + width]
    # Pad the last chunk with repeats so every eval call has the same shape (one compilation).
    padded = chunk + [chunk[-1]] * (width - len(chunk))
    part, completions, _ = generation.generate(generator, params, padded,
                                               jax.random.fold_in(key, start), sampling, samples)
    n = len(chunk) * samples
    correct.append(part.correct[:n])
    if "env_turns" in part.extras:
      episodes.append({k: np.asarray(part.extras[f"env_{k}"][:n]) for k in EPISODE_METRICS[:3]})
    answers.extend(checkers.final_answer(c) for c in completions[:n])
  correct = np.concatenate(correct).reshape(len(problems), samples)
  result = {"pass@1": float(correct[:, 0].mean()) if greedy else float(correct.mean())}
  if episodes:
    stats = {k: np.concatenate([e[k] for e in episodes]).reshape(len(problems), samples)
             for k in EPISODE_METRICS[:3]}
    stats = {k: v[:, 0] if greedy else v.reshape(-1) for k, v in stats.items()}
    result.update({k: float(v.mean()) for k, v in stats.items()})
    result["tool_use"] = float((stats["tool_calls"] > 0).mean())
  if samples > 1:
    result[f"pass@{samples}"] = float(correct.any(axis=1).mean())
  if samples > 1 and not generator.multi_turn:  # episodes: no one final answer
    votes = np.asarray(answers, dtype=object).reshape(len(problems), samples)
    result[f"maj@{samples}"] = float(np.mean([_majority_correct(v, c)
                                              for v, c in zip(votes, correct)]))
  return result


def _majority_correct(votes, correct) -> bool:
  """Whether the most frequent extracted answer (None never votes) is a correct one."""
  counts: dict = {}
  for a in votes:
    if a is not None:
      counts[a] = counts.get(a, 0) + 1
  if not counts:
    return False
  top = max(counts, key=counts.get)
  return bool(correct[list(votes).index(top)])

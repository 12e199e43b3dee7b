"""``rljax eval``: pass@1, pass@k and majority@k on the eval split for any checkpoint.

The policy comes from ``model.source`` (a Hugging Face directory, the SFT cold start, ...) or from
the latest checkpoint of an rljax run directory (``--checkpoint RUN_DIR``).
"""
from __future__ import annotations

import json
import os
import types

import jax
import ml_collections

from rljax import models
from rljax.data import datasets, prompt_policy, tokenizer as tokenizer_lib
from rljax.train import build, loop
from rljax.train.checkpoint import Checkpointer


def run_config(run_dir: str) -> ml_collections.ConfigDict:
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{run_dir!r} is not an rljax run directory (no config.json)")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def load_run_params(run_dir: str, config=None):
  """(ModelConfig, policy params) of the latest checkpoint in ``run_dir``."""
  config = config or run_config(run_dir)
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  model_cfg = build.resolve_model_config(config, tokenizer)
  checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), keep=1,
                              read_only=True)  # reliability: never touches the run's files
  shapes, _ = build.abstract_state(config, model_cfg)
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                         sharding=build.single_device()), shapes)
  _, state, _ = checkpointer.restore_latest(abstract)
  checkpointer.close()
  return model_cfg, state.params


def evaluate_config(config, *, samples: int = 1, checkpoint: str | None = None) -> dict:
  with models.matmul_precision(config.model):
    return _evaluate_config(config, samples=samples, checkpoint=checkpoint)


def _evaluate_config(config, *, samples: int, checkpoint: str | None) -> dict:
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  if checkpoint:
    model_cfg, params = load_run_params(checkpoint)
  else:
    model_cfg, params = build.load_policy(config, tokenizer)
  from rljax.parallel import mesh as mesh_lib
  source = datasets.make_prompt_source(config.data)
  prompt_policy.apply_prompt_policy(source, config, tokenizer)  # reliability
  mesh = mesh_lib.make_mesh(config.mesh)
  ctx = types.SimpleNamespace(
      config=config, model=build.LoadedModel(model_cfg, mesh), mesh=mesh,
      tokenizer=tokenizer, source=source, task_verifier=build.make_task_verifier(config, source),
      sampling=build.sampling_params(config, tokenizer))
  problems = source.eval_set(config.data.num_eval)
  result = {"num_problems": len(problems)}
  result.update(loop.evaluate(ctx, params, problems, samples=1, greedy=True))
  if samples > 1:
    sampled = loop.evaluate(ctx, params, problems, samples=samples, greedy=False)
    result.update({k: v for k, v in sampled.items() if k != "pass@1"})
    result["pass@1_sampled"] = sampled["pass@1"]
  return result

"""``rljax rm --config CONFIG``: a scalar reward model trained on preference pairs.

The model is the policy's network with the ``score`` head (``rljax.models`` ``head='score'``),
started from any policy source (``model.source``: 'tiny', 'hf:PATH' of a causal LM, whose
vocabulary head is replaced by a fresh score head, or of a sequence classifier, trained on;
'run:DIR[@STEP]' of an RL run; 'sft'), on the run's mesh (``mesh.*``), with the policy's
optimizer (``optim.*``). Each step takes ``rm.batch_size`` pairs of ``rm.train_file`` and
minimises the Bradley-Terry loss; the held-out pairs (``rm.eval_file``, else
``rm.eval_fraction`` of the training file) give the pairwise accuracy.

The run directory (``train.run_dir``, held like an RL run's: ``rljax.runs.run_dir``) holds
``config.json``, ``metrics.jsonl`` (``rm/loss``, ``rm/accuracy``; ``rm/eval_accuracy``,
``rm/eval_margin``), ``checkpoints/`` (orbax: step, parameters, optimizer state; resumed with
``train.resume=True``), and a ``transformers`` ``*ForSequenceClassification`` export of every
checkpoint, ``exports/<STEP>/``, and of the final model, ``hf/``: what
``reward.model.source='run:DIR'`` (or ``'run:DIR@STEP'``) reads.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import models
from rljax.data import preferences, tokenizer as tokenizer_lib
from rljax.errors import DataError, StartupError
from rljax.models import hf as hf_lib, transformer
from rljax.models.config import compute_dtype, read_hf_config, run_settings
from rljax.models.source import POLICY_SOURCES, parse_source
from rljax.parallel import distributed, mesh as mesh_lib, rules
from rljax.rewards import reward_model
from rljax.train import build, sft
from rljax.runs import run_dir as run_dir_lib, trackers
from rljax.runs.checkpoint import Checkpointer
from rljax.runs.metrics import MetricsWriter
from rljax.learner.state import make_optimizer


def bradley_terry(chosen, rejected):
  """Bradley-Terry preference loss and pairwise accuracy of scores ``chosen``, ``rejected`` [N]:
  ``L = -mean log sigmoid(r_c - r_r)`` (Bradley & Terry 1952; the reward-model loss of Ouyang
  et al. 2022, eq. 1), ``acc = mean[r_c > r_r]``."""
  margin = chosen - rejected
  return -jnp.mean(jax.nn.log_sigmoid(margin)), jnp.mean((margin > 0).astype(jnp.float32))


def encode_pairs(tokenizer, pairs, width: int) -> tuple[np.ndarray, np.ndarray]:
  """tokens and mask [N, 2, width]: each pair's chosen and rejected rows
  (``reward_model.encode_scored``), left-padded; a row longer than ``width`` is a ``DataError``
  naming its line."""
  tokens = np.full((len(pairs), 2, width), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(pairs), 2, width), np.int32)
  for i, pair in enumerate(pairs):
    for j, response in enumerate((pair.chosen, pair.rejected)):
      ids = reward_model.encode_scored(tokenizer, pair.prompt, response)
      if len(ids) > width:
        raise DataError(f"{pair.where}: the {('chosen', 'rejected')[j]} row is {len(ids)} tokens, "
                        f"more than rm.max_tokens={width}")
      tokens[i, j, width - len(ids):] = ids
      mask[i, j, width - len(ids):] = 1
  return tokens, mask


def initial_params(config, tokenizer):
  """(ModelConfig, params of ``head='score'``) to start from (module docstring); the export
  needs a pad id, the tokenizer's where the checkpoint has none."""
  source = parse_source(config.model.source, "model.source", POLICY_SOURCES)
  if source.kind == "hf" and _is_sequence_classifier(source.path):
    m = config.model
    cfg, params = models.load_hf(source.path, dtype=compute_dtype(m.dtype),
                                 param_dtype=m.param_dtype, head="score")
    cfg = cfg.replace(**run_settings(m))
  else:
    cfg, lm = build.load_policy(config, tokenizer)
    params = {k: v for k, v in lm.items() if k != "lm_head"}
    params["score"] = transformer.init_params(cfg.replace(num_layers=0, vocab_size=1),
                                              seed=config.seed + 11, head="score")["score"]
  if cfg.pad_token_id is None:
    cfg = cfg.replace(pad_token_id=tokenizer.pad_id)
  return cfg, params


def _is_sequence_classifier(path: str) -> bool:
  archs = read_hf_config(path).get("architectures") or []
  return any(str(a).endswith(hf_lib.SEQUENCE_CLASSIFIER) for a in archs)


def read_data(config, tokenizer):
  """(train, held-out) encoded pairs: tokens and mask [N, 2, rm.max_tokens] each."""
  r = config.rm
  if not r.train_file:
    raise StartupError("rljax rm needs rm.train_file: a JSONL file of {\"prompt\", \"chosen\", "
                       "\"rejected\"} pairs")
  train = preferences.read_pairs(r.train_file)
  if r.eval_file:
    held = preferences.read_pairs(r.eval_file, "rm.eval_file")
  else:
    train, held = preferences.split_pairs(train, r.eval_fraction, config.seed)
  return (encode_pairs(tokenizer, train, r.max_tokens),
          encode_pairs(tokenizer, held, r.max_tokens))


def _rows(tokens, mask):
  """[N, 2, S] pairs -> [2N, S] rows: the chosen rows, then the rejected ones."""
  return tuple(np.concatenate([x[:, 0], x[:, 1]]) for x in (tokens, mask))


def train_reward_model(config, *, log=print) -> dict:
  """Train (or resume) the reward model of ``config`` in ``train.run_dir``; returns
  ``{'eval_accuracy', 'eval_margin', 'steps', 'hf'}``."""
  r, t = config.rm, config.train
  run_dir_lib.check_path(t.run_dir)
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  (train_tokens, train_mask), held = read_data(config, tokenizer)
  mesh = mesh_lib.make_mesh(config.mesh)
  divisor = rules.batch_divisor(mesh)
  if (2 * r.batch_size) % divisor:
    raise StartupError(f"rm.batch_size={r.batch_size} pairs make {2 * r.batch_size} rows, not a "
                       f"multiple of the data-parallel width {divisor}")
  with run_dir_lib.claimed(config), models.matmul_precision(config.model):
    cfg, params = initial_params(config, tokenizer)
    fns = _Fns(config, cfg, mesh)
    state = fns.place(params)
    del params
    checkpointer = Checkpointer(os.path.join(t.run_dir, "checkpoints"), keep=t.keep_checkpoints)
    start = 0
    if t.resume and checkpointer.latest_step() is not None:
      if checkpointer.latest_step() > r.steps:
        raise run_dir_lib.RunDirError(
            f"rm.steps={r.steps} is below the latest checkpoint {checkpointer.latest_step()} of "
            f"{t.run_dir}: a resumed run can only grow rm.steps")
      start, state, _ = checkpointer.restore_latest(fns.abstract(state))
    writer = MetricsWriter(t.run_dir, enabled=distributed.is_main_process(),
                           progress_total=r.steps, progress=t.progress, start_step=start,
                           loggers=trackers.factory(config))
    writer.log_config(json.loads(config.to_json_best_effort()))
    evaluate = lambda: _evaluate(fns, state["params"], *held, r.batch_size)
    final = None
    if start == 0:
      writer.write(0, evaluate())
    t0 = time.perf_counter()
    for step in range(start, r.steps):
      index = preferences.batch_indices(len(train_tokens), r.batch_size, step, config.seed)
      rows = distributed.from_host(_rows(train_tokens[index], train_mask[index]), fns.rows)
      state, loss, accuracy = fns.step(state, *rows)
      done = step + 1
      metrics = {"rm/loss": loss, "rm/accuracy": accuracy}
      if done == r.steps or (r.eval_every and done % r.eval_every == 0):
        final = evaluate()
        metrics.update(final)
        log(f"rm step {done}/{r.steps} loss {float(loss):.4f} held-out accuracy "
            f"{metrics['rm/eval_accuracy']:.3f} ({time.perf_counter() - t0:.0f}s)")
      writer.write(done, distributed.to_host(metrics))
      if done == r.steps or (t.checkpoint_every and done % t.checkpoint_every == 0):
        _save(checkpointer, config, cfg, state, done, tokenizer)
    checkpointer.wait()
    checkpointer.close()
    final = final or evaluate()  # a resumed run that had finished trains no step
    hf_dir = os.path.join(t.run_dir, reward_model.EXPORT_DIR)
    _export(hf_dir, cfg, state["params"], tokenizer)
    writer.close()
  return {"eval_accuracy": final["rm/eval_accuracy"], "eval_margin": final["rm/eval_margin"],
          "steps": r.steps, "hf": hf_dir}


def _save(checkpointer, config, cfg, state, step: int, tokenizer) -> None:
  """Checkpoint ``step`` and its export ``exports/<step>`` (what ``run:DIR@STEP`` reads); the
  exports of checkpoints ``train.keep_checkpoints`` dropped go with them."""
  checkpointer.save(step, state, {"config": json.loads(config.to_json_best_effort())},
                    force=step == config.rm.steps)
  exports = os.path.join(config.train.run_dir, reward_model.STEP_EXPORTS)
  _export(os.path.join(exports, str(step)), cfg, state["params"], tokenizer)
  if distributed.is_main_process():
    kept = {str(s) for s in checkpointer.all_steps()}
    for name in os.listdir(exports):
      if name not in kept:
        shutil.rmtree(os.path.join(exports, name), ignore_errors=True)


def _export(path: str, cfg, params, tokenizer) -> None:
  """``path`` replaced by the ``transformers`` export of ``params`` as a whole (written beside
  it, then renamed: a kill leaves the old export or the new one, never half of one)."""
  params = distributed.to_host(params)  # a collective: every process gathers
  if distributed.is_main_process():
    sft.publish_atomically(path, lambda tmp: models.save_hf(tmp, cfg, params,
                                                            tokenizer=tokenizer))


class _Fns:
  """The jitted train step and scorer of one reward model on one mesh, and its state layout:
  ``{'step', 'params', 'opt_state'}``."""

  def __init__(self, config, cfg, mesh):
    tx = make_optimizer(config.optim, config.optim.lr, config.rm.steps)
    shapes = transformer.param_shapes(cfg, "score")
    params_sh = reward_model.param_shardings(mesh, cfg)
    rep = rules.replicated(mesh)
    opt_sh = rules.opt_state_shardings(mesh, jax.eval_shape(tx.init, shapes), params_sh)
    self.sharding = {"step": rep, "params": params_sh, "opt_state": opt_sh}
    self.rows = rules.batch_sharding(mesh, 2)

    def init(params):
      return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}

    def step(state, tokens, mask):
      def loss_fn(params):
        scores = transformer.sequence_scores(cfg, params, tokens, mask)
        half = scores.shape[0] // 2
        return bradley_terry(scores[:half], scores[half:])
      (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
      updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
      params = optax.apply_updates(state["params"], updates)
      return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, loss, accuracy

    self.place = jax.jit(init, out_shardings=self.sharding)
    self.step = jax.jit(step, in_shardings=(self.sharding, self.rows, self.rows),
                        out_shardings=(self.sharding, rep, rep), donate_argnums=0)
    self.scores = reward_model.scoring_fn(cfg, mesh)
    self.divisor = rules.batch_divisor(mesh)

  def abstract(self, state):
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                        state, self.sharding)


def _evaluate(fns: _Fns, params, tokens, mask, batch_pairs: int) -> dict:
  """Pairwise accuracy ``mean[r_c > r_r]`` and mean margin ``r_c - r_r`` over the held-out pairs
  [N, 2, S], scored ``batch_pairs`` pairs at a time (the last batch padded with pair 0, dropped)."""
  n = len(tokens)
  padded = -(-n // batch_pairs) * batch_pairs
  fill = np.concatenate([np.arange(n), np.zeros(padded - n, np.int64)])
  margins = []
  for s in range(0, padded, batch_pairs):
    index = fill[s:s + batch_pairs]
    rows = distributed.from_host(_rows(tokens[index], mask[index]), fns.rows)
    scores = distributed.to_host(fns.scores(params, *rows))
    margins.append(scores[:batch_pairs] - scores[batch_pairs:])
  margin = np.concatenate(margins)[:n]
  return {"rm/eval_accuracy": float(np.mean(margin > 0)), "rm/eval_margin": float(np.mean(margin))}

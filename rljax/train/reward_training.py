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
``rm/eval_margin``), ``data.json`` (the sha256 of the pairs files: a resume on edited pairs is
refused), ``checkpoints/`` (orbax: step, parameters, optimizer state; resumed with
``train.resume=True``; SIGTERM saves the step in flight, ``rljax.runs.preemption``), and a
``transformers`` ``*ForSequenceClassification`` export of every checkpoint, ``exports/<STEP>/``,
and of the final model, ``hf/``: what ``reward.model.source='run:DIR'`` (or ``'run:DIR@STEP'``)
reads. The export pools where ``transformers`` does (``transformer.scored_index``).

Refused before the run directory is claimed: adapters (``model.lora.rank``: the reward model is
trained and exported whole), pairs whose chosen and rejected are the same text (or dropped and
counted with ``data.invalid_rows='drop'``), rows longer than ``rm.max_tokens`` or the model's
context. Batches are padded to their own longest row.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import models
from rljax.data import preferences, tokenizer as tokenizer_lib
from rljax.errors import DataError, StartupError
from rljax.models import transformer
from rljax.loading import loader
from rljax.parallel import distributed, mesh as mesh_lib, rules
from rljax.rewards import reward_model
from rljax.train import build, sft
from rljax.runs import preemption, run_dir as run_dir_lib, trackers
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
  return _stack(encode_ids(tokenizer, pairs, width, f"{width} tokens"), width, tokenizer.pad_id)


def encode_ids(tokenizer, pairs, limit: int, bound: str) -> list[tuple[list[int], list[int]]]:
  """Each pair's (chosen, rejected) ids (``reward_model.encode_scored``); a row longer than
  ``limit`` tokens is a ``DataError`` naming its line and ``bound`` (what sets the limit)."""
  out = []
  for pair in pairs:
    rows = tuple(reward_model.encode_scored(tokenizer, pair.prompt, r)
                 for r in (pair.chosen, pair.rejected))
    for name, ids in zip(("chosen", "rejected"), rows):
      if len(ids) > limit:
        raise DataError(f"{pair.where}: the {name} row is {len(ids)} tokens, more than {bound}")
    out.append(rows)
  return out


def _stack(encoded, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """tokens and mask [N, 2, width] of encoded pairs, left-padded with ``pad_id``."""
  tokens = np.full((len(encoded), 2, width), pad_id, np.int32)
  mask = np.zeros((len(encoded), 2, width), np.int32)
  for i, pair in enumerate(encoded):
    for j, ids in enumerate(pair):
      tokens[i, j, width - len(ids):] = ids
      mask[i, j, width - len(ids):] = 1
  return tokens, mask


@dataclasses.dataclass
class PairRows:
  """Encoded pairs, padded batch by batch to the width the batch needs (``reward_model.bucket``:
  the next power of two, at most ``limit``): a long ``rm.max_tokens`` costs nothing unless rows
  are that long."""
  encoded: list
  limit: int
  pad_id: int

  def __len__(self) -> int:
    return len(self.encoded)

  def rows(self, index) -> tuple[np.ndarray, np.ndarray]:
    """tokens and mask [2n, W] of pairs ``index`` [n]: the chosen rows, then the rejected."""
    picked = [self.encoded[i] for i in index]
    width = min(reward_model.bucket(max(len(ids) for pair in picked for ids in pair)), self.limit)
    tokens, mask = _stack(picked, width, self.pad_id)
    return tuple(np.concatenate([x[:, 0], x[:, 1]]) for x in (tokens, mask))


def row_limit(config, tokenizer) -> tuple[int, str]:
  """The longest row ``rljax rm`` scores: ``rm.max_tokens``, bound by the model's context
  (from its source's config alone, no weights), and what sets it, for messages."""
  context = build.resolve_model_config(config, tokenizer).max_position_embeddings
  if config.rm.max_tokens <= context:
    return config.rm.max_tokens, f"rm.max_tokens={config.rm.max_tokens}"
  return context, (f"the model's context of {context} positions (max_position_embeddings; "
                   f"rm.max_tokens={config.rm.max_tokens})")


def initial_params(config, tokenizer):
  """(ModelConfig, params of ``head='score'``) to start from (module docstring). Its padding id
  is the tokenizer's, which pads the rows: the export then pools where ``transformers`` does
  (``transformer.scored_index``; EOS for a tokenizer without a pad token)."""
  if loader.is_score_model(loader.source_of(config, "rm_start")):  # trained on
    loaded = loader.load(config, "rm_start", tokenizer)
    cfg, params = loaded.cfg, loaded.params
  else:
    cfg, lm = build.load_policy(config, tokenizer)
    params = {k: v for k, v in lm.items() if k != "lm_head"}
    params["score"] = transformer.init_params(cfg.replace(num_layers=0, vocab_size=1),
                                              seed=config.seed + 11, head="score")["score"]
  return cfg.replace(pad_token_id=tokenizer.pad_id), params


PAIR_FILES = ("rm.train_file", "rm.eval_file")  # fingerprinted in data.json like data files


def read_pairs(config, *, log=print) -> tuple[list, list, int]:
  """(train, held-out pairs, how many were left out); pairs whose chosen and rejected are the
  same text are refused (``data.invalid_rows='error'``) or left out, counted and reported
  (``'drop'``): their margin is 0 whatever the model, so they teach nothing and count as wrong
  in the accuracy."""
  r = config.rm
  if not r.train_file:
    raise StartupError("rljax rm needs rm.train_file: a JSONL file of {\"prompt\", \"chosen\", "
                       "\"rejected\"} pairs")
  train, dropped = _distinct(preferences.read_pairs(r.train_file), config.data.invalid_rows, log)
  if r.eval_file:
    held, also = _distinct(preferences.read_pairs(r.eval_file, "rm.eval_file"),
                           config.data.invalid_rows, log)
    return train, held, dropped + also
  train, held = preferences.split_pairs(train, r.eval_fraction, config.seed)
  return train, held, dropped


def _distinct(pairs, invalid_rows: str, log) -> tuple[list, int]:
  same = [p for p in pairs if p.chosen == p.rejected]
  if not same:
    return pairs, 0
  if invalid_rows == "error":
    raise DataError(f"{same[0].where}: chosen and rejected are the same text, so the pair "
                    f"teaches nothing (its margin is 0 whatever the model){_more(same)}; fix the "
                    "row, or set data.invalid_rows='drop' to leave such pairs out (counted)")
  log(f"data.invalid_rows='drop': left out {len(same)} of {len(pairs)} pairs whose chosen and "
      f"rejected are the same text; first: {same[0].where}")
  kept = [p for p in pairs if p.chosen != p.rejected]
  if not kept:
    raise DataError(f"{same[0].where.rsplit(':', 1)[0]}: every pair's chosen and rejected are "
                    "the same text: no pair is left to learn from")
  return kept, len(same)


def _more(rows) -> str:
  return f" ({len(rows) - 1} more such pairs)" if len(rows) > 1 else ""


def check_start(config) -> None:
  """What ``rljax rm`` refuses before anything is read: adapters (``model.lora.rank``), which
  it does not train (every weight of the reward model is trained and exported as a whole
  ``*ForSequenceClassification``)."""
  if config.model.lora.rank:
    raise StartupError(
        f"rljax rm trains every weight of the reward model and exports it as a whole "
        f"*ForSequenceClassification; model.lora.rank={config.model.lora.rank} (low-rank "
        "adapters) is not supported for reward models: set model.lora.rank=0")


def train_reward_model(config, *, log=print, what: str = "") -> dict:
  """Train (or resume) the reward model of ``config`` in ``train.run_dir``; returns
  ``{'eval_accuracy', 'eval_margin', 'steps', 'hf', 'dropped_pairs'}``. SIGTERM and Ctrl-C end
  it as they end an RL run (``rljax.runs.preemption``: the step saved, one line; ``what``: its
  name there when it runs inside another command)."""
  r, t = config.rm, config.train
  check_start(config)
  run_dir_lib.check_path(t.run_dir)
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  if build.model_source(config).kind == "sft":  # what would stop the cold start midway
    sft.check_cold_start(config, tokenizer)
  limit, bound = row_limit(config, tokenizer)
  train_pairs, held_pairs, dropped = read_pairs(config, log=log)
  train = PairRows(encode_ids(tokenizer, train_pairs, limit, bound), limit, tokenizer.pad_id)
  held = PairRows(encode_ids(tokenizer, held_pairs, limit, bound), limit, tokenizer.pad_id)
  mesh = mesh_lib.make_mesh(config.mesh)
  divisor = rules.batch_divisor(mesh)
  if (2 * r.batch_size) % divisor:
    raise StartupError(f"rm.batch_size={r.batch_size} pairs make {2 * r.batch_size} rows, not a "
                       f"multiple of the data-parallel width {divisor}")
  with run_dir_lib.claimed(config, PAIR_FILES, "rm.steps"), \
      models.matmul_precision(config.model), \
      preemption.preemptible(t.run_dir, t.preempt_grace_s, what=what) as guard:
    with guard.droppable():
      run = _start(config, tokenizer, mesh)
    guard.attach(save=lambda step, extra: _save(run, config, step, force=True),
                 close=run.close)
    return dict(_train(config, run, train, held, guard, log), dropped_pairs=dropped)


@dataclasses.dataclass
class _Run:
  """A reward model's training as it stands: its functions, state, checkpoints and metrics."""
  fns: "_Fns"
  cfg: Any
  state: Any
  checkpointer: Checkpointer
  writer: MetricsWriter
  tokenizer: Any
  start: int

  def close(self) -> None:
    """Complete pending saves (never left half-written) and close the metrics."""
    self.checkpointer.close()
    self.writer.close()


def _start(config, tokenizer, mesh) -> _Run:
  """The model placed on ``mesh``, restored from the latest checkpoint on a resume."""
  r, t = config.rm, config.train
  cfg, params = initial_params(config, tokenizer)
  fns = _Fns(config, cfg, mesh)
  state = fns.place(params)
  del params
  checkpointer = Checkpointer(os.path.join(t.run_dir, "checkpoints"), keep=t.keep_checkpoints)
  start = 0
  if t.resume and checkpointer.latest_step() is not None:  # rm.steps checked when claimed
    start, state, _ = checkpointer.restore_latest(fns.abstract(state))
  writer = MetricsWriter(t.run_dir, enabled=distributed.is_main_process(),
                         progress_total=r.steps, progress=t.progress, start_step=start,
                         loggers=trackers.factory(config))
  writer.log_config(json.loads(config.to_json_best_effort()))
  return _Run(fns=fns, cfg=cfg, state=state, checkpointer=checkpointer, writer=writer,
              tokenizer=tokenizer, start=start)


def _train(config, run: _Run, train: PairRows, held: PairRows, guard, log) -> dict:
  """Steps ``run.start .. rm.steps`` (a step boundary per ``guard.at_step``), the evals, the
  checkpoints and their exports, and the final export ``hf/``."""
  r, t = config.rm, config.train
  evaluate = lambda: _evaluate(run.fns, run.state["params"], held, r.batch_size)
  final = None
  guard.at_step(run.start, None)  # checkpoint `start` exists, or start is 0: nothing to save
  if run.start == 0:
    with guard.droppable():
      initial = evaluate()
    run.writer.write(0, initial)
  t0 = time.perf_counter()
  for step in range(run.start, r.steps):
    if step > run.start:
      guard.at_step(step, None)
    index = preferences.batch_indices(len(train), r.batch_size, step, config.seed)
    rows = distributed.from_host(train.rows(index), run.fns.rows)
    run.state, loss, accuracy = run.fns.step(run.state, *rows)
    done = step + 1
    metrics = {"rm/loss": loss, "rm/accuracy": accuracy}
    if done == r.steps or (r.eval_every and done % r.eval_every == 0):
      final = evaluate()
      metrics.update(final)
      log(f"rm step {done}/{r.steps} loss {float(loss):.4f} held-out accuracy "
          f"{metrics['rm/eval_accuracy']:.3f} ({time.perf_counter() - t0:.0f}s)")
    run.writer.write(done, distributed.to_host(metrics))
    if done == r.steps or (t.checkpoint_every and done % t.checkpoint_every == 0):
      _save(run, config, done, force=done == r.steps)
  if r.steps > run.start:
    guard.at_step(r.steps, None)
  run.checkpointer.wait()
  if final is None:  # a resumed run that had finished trains no step
    with guard.droppable():
      final = evaluate()
  hf_dir = os.path.join(t.run_dir, reward_model.EXPORT_DIR)
  _export(hf_dir, run.cfg, run.state["params"], run.tokenizer)
  run.close()
  return {"eval_accuracy": final["rm/eval_accuracy"], "eval_margin": final["rm/eval_margin"],
          "steps": r.steps, "hf": hf_dir}


def _save(run: _Run, config, step: int, force: bool = False) -> None:
  """Checkpoint ``step`` and its export ``exports/<step>`` (what ``run:DIR@STEP`` reads); the
  exports of checkpoints ``train.keep_checkpoints`` dropped go with them."""
  run.checkpointer.save(step, run.state, {"config": json.loads(config.to_json_best_effort())},
                        force=force)
  exports = os.path.join(config.train.run_dir, reward_model.STEP_EXPORTS)
  _export(os.path.join(exports, str(step)), run.cfg, run.state["params"], run.tokenizer)
  if distributed.is_main_process():
    kept = {str(s) for s in run.checkpointer.all_steps()}
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


def _evaluate(fns: _Fns, params, held: PairRows, batch_pairs: int) -> dict:
  """Pairwise accuracy ``mean[r_c > r_r]`` and mean margin ``r_c - r_r`` over the held-out pairs,
  scored ``batch_pairs`` pairs at a time (the last batch padded with pair 0, dropped)."""
  n = len(held)
  padded = -(-n // batch_pairs) * batch_pairs
  fill = np.concatenate([np.arange(n), np.zeros(padded - n, np.int64)])
  margins = []
  for s in range(0, padded, batch_pairs):
    rows = distributed.from_host(held.rows(fill[s:s + batch_pairs]), fns.rows)
    scores = distributed.to_host(fns.scores(params, *rows))
    margins.append(scores[:batch_pairs] - scores[batch_pairs:])
  margin = np.concatenate(margins)[:n]
  return {"rm/eval_accuracy": float(np.mean(margin > 0)), "rm/eval_margin": float(np.mean(margin))}

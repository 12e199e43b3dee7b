"""Supervised cold start (the R1 recipe's SFT stage) on generated solutions of an embedded task.

``rljax sft --config ...`` or ``model.source='sft'`` in an RL config: a tiny policy learns the
answer format and some skill from reference solutions, so that RL starts from a policy that is
sometimes right. The result is a Hugging Face directory in ``sft.out_dir``; it is reused by later
runs whose ``sft``, ``model`` and ``data`` sections are the same (a stamp file records them). A
cold start of other settings is never replaced: ``resolve_out_dir`` puts this one beside it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rljax import algos, models
from rljax.config import effects
from rljax.data import datasets, images as images_lib, sources, tasks
from rljax.envs import tools, validate
from rljax.envs.episodes import message_turns
from rljax.learner import state as state_lib
from rljax.errors import DataError, StartupError
from rljax.models import transformer
from rljax.runs import preemption
from rljax.runs.checkpoint import Checkpointer
from rljax.runs.run_dir import check_creatable, flatten_config
from rljax.vision import multimodal

STAMP_FILE = "rljax_sft_stamp.json"


def cold_start_stamp(config) -> dict:
  """What the cold start depends on; a saved one is reused while its stamp is equal: the
  ``sft``, ``model`` and ``data`` keys that ``rljax sft`` reads (``Key.commands``; e.g. not the
  adapters a run puts on the cold start, ``model.lora.*``, nor ``data.train_seed``, the RL run's
  order of prompts: its examples come from the stream of ``sft.seed``; nor the eval keys: the eval
  split is held out by a hash of the prompt), less its own directory (``sft.out_dir``, a
  bookkeeping key), so a cold start moved elsewhere, or named by a relative path in one run and an
  absolute one in another, is still found valid. Nor is the run's ``seed``: the cold start's init
  and examples are drawn from ``sft.seed``, so the seeds of a study are RL runs from one cold
  start, as runs of the field start from one pretrained model. An embedded task adds what defines
  its problems (``task_identity``): a level changed under the same number is not the same data."""
  stamp = {"sft": {}, "model": {}, "data": {}}
  for name in effects.sft_stamp_keys():
    *sections, leaf = name.split(".")
    node, tree = config, stamp
    for section in sections:
      node, tree = node[section], tree.setdefault(section, {})
    value = node[leaf]
    tree[leaf] = value.to_dict() if hasattr(value, "to_dict") else value
  source, arg = sources.parse_data_source(config.data.source)
  if source == "embedded":
    stamp["task"] = task_identity(tasks.make_task(arg, config.data.difficulty))
  if config.env.name is not None:
    # Multi-turn cold starts leave the observations unlearned; ones saved before did not.
    stamp["observations"] = "unlearned"
    if config.env.tool_format == "hermes":  # demonstrations rendered as the run's turns are
      stamp["tool_format"] = "hermes"
  return stamp


def task_identity(task, samples: int = 4) -> dict:
  """What defines an embedded task's problems beyond its name and difficulty number: the level's
  parameters and a digest of its first ``samples`` train problems (prompt, solution, answer and
  images). A cold start trained on a level that was since renumbered, redrawn or retuned differs
  in it though its ``data.difficulty`` is the same, so it is not reused."""
  digest = hashlib.sha256()
  for index in range(samples):
    problem = task.problem_at(0, index)
    for part in (problem.prompt, problem.solution, problem.answer,
                 images_lib.images_digest(tuple(problem.images))):
      digest.update(str(part).encode() + b"\0")
  return {"name": task.name, "level": repr(task.level), "problems": digest.hexdigest()[:16]}


def read_stamp(directory: str) -> dict | None:
  """The stamp saved with the cold start in ``directory`` (None if there is none); one written
  before the directory was left out of the stamp is read without it."""
  path = os.path.join(directory, STAMP_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    stamp = json.load(f)
  stamp.get("sft", {}).pop("out_dir", None)
  return stamp


def stamp_key(stamp: dict) -> str:
  """A short hash of a cold start's stamp: the name of cold starts kept side by side (the sweep's
  ``<root>/_sft/<key>``, ``<sft.out_dir>-<key>`` beside another config's)."""
  return hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:10]


def resolve_out_dir(config, *, log=print) -> str:
  """Where this config's cold start lives, written back to ``config.sft.out_dir``: that directory,
  unless it holds the cold start of other settings. That one is kept (another run, or a LoRA
  run's base, may use it), and this config's lives beside it in ``<sft.out_dir>-<stamp_key>``;
  so changing ``sft.seed`` back and forth trains each cold start once."""
  out = config.sft.out_dir
  want = cold_start_stamp(config)
  saved = read_stamp(out)
  if saved is None or saved == want:
    return out
  beside = f"{os.path.normpath(out)}-{stamp_key(want)}"
  a, b = flatten_config(saved), flatten_config(want)
  changed = [f"{k} {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
             for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]
  log(f"sft.out_dir={out!r} holds the cold start of other settings ({', '.join(changed)}); it "
      f"is kept, and this run's cold start is {beside}")
  with config.unlocked():
    config.sft.out_dir = beside
  return beside


def encode_example(tokenizer, problem, tool_format: str = "compact", processor=None,
                   prompt_ids=None) -> tuple[list[int], list[int]]:
  """(tokens, loss mask): the prompt, then the reference solution and EOS, which are learned. A
  multi-turn demonstration (``problem.meta['episode']``) is encoded piece by piece, as the rollout
  driver encodes an episode in ``tool_format``: its observations are in the input but not
  learned (mask 0), as in the RL loss; the policy's turns and EOS are. A piece that is a tuple
  is structured: a turn's calls ``((name, arguments), ...)`` (written with ``tools.render_calls``)
  or their results ``(text, ...)`` (answered as ``ToolEnv`` answers them). Where turns are chat
  messages (hermes calls with a chat template: ``rljax.envs.episodes.message_turns``) every turn
  ends with EOS and the results are rendered by the chat template, so the demonstration is the
  conversation exactly as the template renders it. With a vision-language policy's image
  ``processor``, the prompt's images stand as their placeholders
  (``images_lib.encode_image_prompts``), as the sampler sees them; ``prompt_ids``: the prompt
  already encoded so."""
  chat = message_turns(tokenizer, tool_format)
  if prompt_ids is not None:
    tokens = list(prompt_ids)
  elif processor is None:
    tokens = list(tokenizer.encode_prompt(problem.prompt))
  else:
    tokens = list(images_lib.encode_image_prompts(tokenizer, [problem], processor).ids[0])
  learn = [0] * len(tokens)
  for k, piece in enumerate(problem.meta.get("episode", (problem.solution,))):
    if k % 2 == 0:  # the policy's turn
      text = piece if isinstance(piece, str) else tools.render_calls(piece, tool_format)
      ids = tokenizer.encode(text) + ([tokenizer.eos_id] if chat else [])
    else:
      observation = piece if isinstance(piece, str) else tools.tool_observation(piece,
                                                                                 tool_format)
      ids = validate.observation_ids(tokenizer, observation)
    tokens, learn = tokens + ids, learn + [int(k % 2 == 0)] * len(ids)
  if chat:
    return tokens, learn
  return tokens + [tokenizer.eos_id], learn + [1]


def make_batch(tokenizer, problems, width: int, tool_format: str = "compact", prompts=None):
  """Left-padded [B, width] tokens, attention mask and loss mask (``prompts``: the problems'
  prompt ids, ``encode_example``'s ``prompt_ids``)."""
  tokens = np.full((len(problems), width), tokenizer.pad_id, np.int32)
  attn = np.zeros((len(problems), width), np.int32)
  loss = np.zeros((len(problems), width), np.float32)
  for i, p in enumerate(problems):
    ids, learn = encode_example(tokenizer, p, tool_format,
                                prompt_ids=None if prompts is None else prompts[i])
    if len(ids) > width:
      raise DataError(_too_wide(len(ids), width, p))
    tokens[i, width - len(ids):] = ids
    attn[i, width - len(ids):] = 1
    loss[i, width - len(ids):] = learn
  return tokens, attn, loss


def image_batch(model_cfg, tokenizer, problems, width: int, processor):
  """``make_batch`` of a vision-language policy's examples and their images: (tokens, attention
  mask, loss mask, ``multimodal.RowImages`` of each row); the prompts' images stand as their
  placeholders (``images_lib.encode_image_prompts``, one pass over the batch)."""
  encoded = images_lib.encode_image_prompts(tokenizer, problems, processor)
  tokens, attn, loss = make_batch(tokenizer, problems, width, prompts=encoded.ids)
  return tokens, attn, loss, multimodal.row_images(model_cfg, tokens, attn, encoded.pixel_values,
                                                   encoded.image_grid_thw)


def cold_start_policy(config, tokenizer):
  """(the fresh policy's ``ModelConfig``, its image processor or None): a vision-language family
  (``model.family`` with a tower) learns from the prompts' images, processed as the RL run's
  sampler processes them (``images_lib.image_format`` of the family)."""
  model_cfg = models.tiny_config(config.model, tokenizer.vocab_size, eos_token_id=tokenizer.eos_id,
                                 pad_token_id=tokenizer.pad_id).base
  if model_cfg.vision is None:
    return model_cfg, None
  return model_cfg, images_lib.image_format(model_cfg, tokenizer)


def _too_wide(length: int, width: int, problem) -> str:
  return (f"an SFT example of {length} tokens (prompt, solution, EOS) is wider than the "
          f"sampler's window of {width} (data.prompt_bucket + rollout.max_new_tokens): "
          f"{problem.prompt!r}; raise rollout.max_new_tokens or data.prompt_bucket, or train on "
          "an easier data.difficulty")


def check_cold_start(config, tokenizer) -> None:
  """What would stop the cold start midway, checked before anything is written (``rljax sft``,
  and ``rljax train`` with ``model.source='sft'`` before it claims its run dir), unless
  ``sft.out_dir`` already holds it: the directory can be written, and every example of the
  ``sft.steps`` batches it draws (and of the exact-match check, with ``sft.stop_match``) has a
  reference solution and fits the sampler's window (the same streams, drawn and encoded again: a
  small part of the training's own time, docs/reliability.md)."""
  out = resolve_out_dir(config)  # says so where it puts this cold start beside another
  if read_stamp(out) == cold_start_stamp(config):
    return
  if os.path.isdir(out) and os.listdir(out):
    raise StartupError(f"sft.out_dir={out!r} holds files that are not this config's SFT cold "
                       "start; choose another sft.out_dir")
  check_creatable(out, "sft.out_dir")
  s = config.sft
  width = config.data.prompt_bucket + config.rollout.max_new_tokens
  _, processor = cold_start_policy(config, tokenizer)
  takes = processor is not None
  source = datasets.make_prompt_source(config.data, stream_seed=s.seed, takes_images=takes)
  drawn = [source.next_batch(s.batch_size) for _ in range(s.steps)]
  if s.stop_match > 0:  # the exact-match check's examples (train_sft), their own stream
    checked = datasets.make_prompt_source(config.data, stream_seed=_check_stream_seed(s.seed),
                                          takes_images=takes)
    drawn.append(checked.next_batch(s.check_size))
  prompts = {}  # a prompt with images, by its text and image sizes: its placeholders' ids
  for problem in (p for batch in drawn for p in batch):
    if not problem.solution:
      raise StartupError(_NO_SOLUTIONS.format(source=config.data.source))
    ids = None
    if processor is not None:  # the processor's grid depends on the image's size alone
      key = (problem.prompt, tuple((im.height, im.width) for im in problem.images))
      if key not in prompts:
        prompts[key] = images_lib.encode_image_prompts(tokenizer, [problem], processor).ids[0]
      ids = prompts[key]
    length = len(encode_example(tokenizer, problem, config.env.tool_format, prompt_ids=ids)[0])
    if length > width:
      raise StartupError(_too_wide(length, width, problem))


_NO_SOLUTIONS = ("SFT needs reference solutions; data.source={source!r} has none (use an "
                 "embedded task)")


def _forward(model_cfg, params, tokens, attn, images):
  """(hidden, bound model) of the rows, with their images (``RowImages``) where they have any."""
  if images is None:
    return transformer.forward_with_routes(model_cfg, params, tokens, attn)[:2]
  return multimodal.forward_rows(model_cfg, params, tokens, attn, images)


def sft_loss(model_cfg, params, tokens, attn, loss_mask, chunk: int, images=None):
  """Token-mean next-token NLL over the solution tokens (``images``: the rows' ``RowImages``)."""
  hidden, model = _forward(model_cfg, params, tokens, attn, images)
  logp, _ = algos.token_logprobs_and_entropy(hidden[:, :-1], model.head_weight(), tokens[:, 1:],
                                             chunk=chunk)
  mask = loss_mask[:, 1:]
  return -(logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def exact_match(model_cfg, params, tokens, attn, loss_mask, images=None):
  """Share of rows that greedy decoding would write exactly: the teacher-forced argmax equals
  the reference at every learned token, so the greedy continuation of the prompt is the
  reference solution (a row can still be right through another solution; this counts only the
  reference's, a lower bound on greedy accuracy). One forward, no decoding."""
  hidden, model = _forward(model_cfg, params, tokens, attn, images)
  # The cold start is a tiny character-level model (a vocabulary of tens), so the full logits
  # are small; a soft-cap would not move the argmax.
  logits = hidden[:, :-1].astype(jnp.float32) @ model.head_weight().astype(jnp.float32)
  hit = (jnp.argmax(logits, axis=-1) == tokens[:, 1:]) | (loss_mask[:, 1:] == 0)
  return hit.all(axis=-1).mean()


def sampled_match(model_cfg, params, tokens, attn, loss_mask, images=None):
  """Mean over rows of the probability that sampling at temperature 1 writes the reference:
  ``exp(sum_t mask_t log pi(y_t | y_<t))`` over the learned tokens (teacher-forced; the
  observations between turns are given, as the environment gives them). It is the share of a
  fresh RL run's samples that reproduce a reference solution, a lower bound on its expected
  reward where the reference is right; where references take several strategies (a tool call in
  some, a direct answer in others) it counts every strategy at the rate the policy samples it,
  which greedy ``exact_match`` cannot (it sees the likeliest strategy alone)."""
  hidden, model = _forward(model_cfg, params, tokens, attn, images)
  # Full logits, as exact_match (a vocabulary of tens).
  logits = hidden[:, :-1].astype(jnp.float32) @ model.head_weight().astype(jnp.float32)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, 1:, None], axis=-1)
  return jnp.exp((logp[..., 0] * loss_mask[:, 1:]).sum(axis=-1)).mean()


def _check_stream_seed(sft_seed: int) -> int:
  """The exact-match problems' own stream, apart from the examples SFT trains on."""
  return sft_seed + 1_000_003


def train_sft(config, tokenizer, *, log=print):
  """Train a fresh tiny policy on reference solutions: returns (ModelConfig, params). The cold
  start is a full model: a run with low-rank adapters (``model.lora.*``) puts them on it."""
  s = config.sft
  model_cfg, processor = cold_start_policy(config, tokenizer)
  params = transformer.init_params(model_cfg, seed=s.seed)
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, s.lr, max(s.warmup_steps, 1)),
       optax.cosine_decay_schedule(s.lr, max(s.steps - s.warmup_steps, 1), alpha=0.1)],
      [max(s.warmup_steps, 1)])
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
  # model.vision.trainable=False: the tower is no argument of the gradient (state.trainable).
  opt_state = tx.init(state_lib.trainable(params, model_cfg))
  width = config.data.prompt_bucket + config.rollout.max_new_tokens

  @jax.jit
  def step(params, opt_state, tokens, attn, loss_mask, images=None):
    train = state_lib.trainable(params, model_cfg)
    loss, grads = jax.value_and_grad(
        lambda p: sft_loss(model_cfg, state_lib.with_trainable(params, p, model_cfg), tokens, attn,
                           loss_mask, config.model.logits_chunk, images))(train)
    updates, opt_state = tx.update(grads, opt_state, train)
    return (state_lib.with_trainable(params, optax.apply_updates(train, updates), model_cfg),
            opt_state, loss)

  # Looked up here, not bound at import, so a test can script either check.
  match = jax.jit(functools.partial(exact_match if s.stop_on == "greedy" else sampled_match,
                                    model_cfg))
  what = "exact match" if s.stop_on == "greedy" else "sampled match"
  takes = processor is not None

  def batch(problems):  # tokens, attention and loss masks (and the rows' images)
    if processor is None:
      return make_batch(tokenizer, problems, width, config.env.tool_format)
    return image_batch(model_cfg, tokenizer, problems, width, processor)

  check = None
  if s.stop_match > 0:
    checked = datasets.make_prompt_source(config.data, stream_seed=_check_stream_seed(s.seed),
                                          takes_images=takes)
    check = batch(checked.next_batch(s.check_size))
  source = datasets.make_prompt_source(config.data, stream_seed=s.seed, takes_images=takes)
  held = {"params": params, "opt_state": opt_state}  # the state after the steps done
  partial = partial_dir(config.sft.out_dir)
  with preemption.preemptible(config.sft.out_dir, config.train.preempt_grace_s,
                              checkpoints=partial, what="in the SFT cold start ",
                              hint=None if preemption.active() else RERUN_HINT) as guard:
    with guard.droppable():
      start = _resume(partial, held, source, _stamp_json(config), log)
    extra = lambda: {"stamp": _stamp_json(config), "data": source.state_dict()}
    guard.attach(save=lambda i, data: _save_partial(partial, i, held, data), close=lambda: None)
    t0 = time.perf_counter()
    for i in range(start, s.steps):
      guard.at_step(i, extra())
      problems = source.next_batch(s.batch_size)
      if any(not p.solution for p in problems):
        raise StartupError(_NO_SOLUTIONS.format(source=config.data.source))
      held["params"], held["opt_state"], loss = step(held["params"], held["opt_state"],
                                                     *batch(problems))
      if (i + 1) % max(s.steps // 10, 1) == 0 or i == 0:
        log(f"sft step {i + 1}/{s.steps} loss {float(loss):.4f} ({time.perf_counter() - t0:.0f}s)")
      if check is not None and (i + 1) % s.check_every == 0:
        rate = float(match(held["params"], *check))
        log(f"sft step {i + 1} {what} {rate:.3f}")
        if rate >= s.stop_match:
          log(f"sft stopped at step {i + 1}: {what} {rate:.3f} >= sft.stop_match "
              f"{s.stop_match} ({time.perf_counter() - t0:.0f}s)")
          break
    else:
      if check is not None:
        log(f"sft ran all {s.steps} steps: {what} {float(match(held['params'], *check)):.3f}"
            f" < sft.stop_match {s.stop_match}")
  return model_cfg, held["params"]


RERUN_HINT = "rerun the same command to continue it"  # `rljax sft` reads no train.resume


def partial_dir(out: str) -> str:
  """Where a preempted cold start of ``out`` keeps its last step (removed once ``out`` is
  published)."""
  return f"{os.path.normpath(out)}.partial"


def _stamp_json(config) -> dict:
  """The cold start's stamp as a checkpoint's JSON holds it (tuples as lists)."""
  return json.loads(json.dumps(cold_start_stamp(config)))


def _save_partial(partial: str, step: int, held: dict, extra: dict) -> None:
  """A preempted cold start's state after ``step`` steps, committed in ``partial``."""
  with Checkpointer(partial, keep=1) as checkpointer:
    checkpointer.save(step, held, extra, force=True)


def _resume(partial: str, held: dict, source, stamp: dict, log) -> int:
  """The step a preempted cold start of these settings saved in ``partial`` (its state into
  ``held``, its data position into ``source``), or 0. One of other settings (changed since) is
  removed: the next preemption saves there."""
  if not os.path.isdir(partial):
    return 0
  with Checkpointer(partial, keep=1) as checkpointer:
    step = checkpointer.latest_step()
    if step is None:
      return 0
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                            held)
    state, extra = checkpointer.restore(step, abstract)
  if extra.get("stamp") != stamp:
    log(f"{partial} holds a preempted cold start of other settings; removed")
    shutil.rmtree(partial, ignore_errors=True)
    return 0
  held.update(state)
  source.load_state_dict(extra["data"])
  log(f"continuing the preempted SFT cold start at step {step} ({partial})")
  return step


def ensure_sft_checkpoint(config, tokenizer, *, log=print) -> str:
  """The cold start's directory (``resolve_out_dir``), trained and saved first if it is missing."""
  out = resolve_out_dir(config, log=log)
  want = cold_start_stamp(config)
  if read_stamp(out) == want:
    log(f"using the SFT cold start in {out}")
    return out
  if os.path.isdir(out) and os.listdir(out):
    raise StartupError(f"sft.out_dir={out!r} holds files that are not this config's SFT cold "
                       "start; choose another sft.out_dir")
  log(f"training the SFT cold start into {out}")
  with models.matmul_precision(config.model):
    model_cfg, params = train_sft(config, tokenizer, log=log)
  publish_atomically(out, lambda tmp: _write_cold_start(tmp, model_cfg, params, want))
  shutil.rmtree(partial_dir(out), ignore_errors=True)
  return out


def _write_cold_start(directory: str, model_cfg, params, stamp: dict) -> None:
  models.save_hf(directory, model_cfg, jax.device_get(params))
  with open(os.path.join(directory, STAMP_FILE), "w") as f:
    json.dump(stamp, f, indent=2)


def _alive(pid: str) -> bool:
  """Whether process ``pid`` (of a temporary directory's name) still runs on this host."""
  try:
    os.kill(int(pid), 0)
  except (ValueError, ProcessLookupError):
    return False
  except PermissionError:
    return True
  return True


def publish_atomically(out: str, write) -> None:
  """``write(tmp)`` fills a fresh sibling directory, which then replaces ``out`` by renames: a
  kill at any moment leaves either the old ``out`` (or none) or the complete new one, never
  weights without their stamp. Temporary directories of killed writes are removed (they are
  ours: ``<out>.tmp-<pid>-<ns>`` of a dead pid); what ``out`` held is removed only after the
  swap."""
  parent, name = os.path.split(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  for leftover in os.listdir(parent):
    if ((leftover.startswith(f"{name}.tmp-") and not _alive(leftover.split("-")[-2]))
        or leftover.startswith(f"{name}.old-")):
      shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
  tmp = os.path.join(parent, f"{name}.tmp-{os.getpid()}-{time.time_ns()}")
  os.makedirs(tmp)
  write(tmp)
  old = None
  if os.path.exists(out):
    old = os.path.join(parent, f"{name}.old-{time.time_ns()}")
    os.rename(out, old)
  os.rename(tmp, out)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)

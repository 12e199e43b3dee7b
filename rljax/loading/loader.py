"""The one model loader: a source (``rljax.config.sources``) of a role (``rljax.loading.roles``)
into ``(ModelConfig, params)``, the same way for the policy, its reference, the distillation
teacher, the judge, the reward model, the start of ``rljax rm``, ``rljax.load`` and
``rljax plan`` (the architecture alone).

- **dtype**: the role's own key when it sets one (``teacher.dtype``, ``reward.model.dtype``),
  else ``model.dtype`` (``compute_dtype``); the weights are stored in ``model.param_dtype``.
- **run:DIR[@STEP]**: the model of checkpoint ``STEP`` of the rljax run DIR (default: its latest
  committed one), with the architecture of its ``config.json``, for every role. A policy run's
  checkpoint holds a policy (its adapters merged onto their pinned base); an ``rljax rm`` run's a
  reward model (read from that checkpoint's export ``exports/STEP``). A role reading the other
  kind is one line.
- **tokenizer**: ``check_tokenizer``, once, for every role that reads the run's token ids.
- Arrays come back on the host (NumPy): the caller places them on its mesh, whatever the number
  of devices.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rljax import models
from rljax.config.sources import ModelSource, parse_source, run_config
from rljax.data import tokenizer as tokenizer_lib
from rljax.errors import ModelFileError, RunDirError, StartupError, TokenizerError
from rljax.learner import initial, state as state_lib
from rljax.loading import pin
from rljax.loading.roles import Role, role as role_of
from rljax.models import ModelConfig, lora, peft, transformer
from rljax.models import hf as hf_lib
from rljax.models.config import compute_dtype, lora_settings, read_hf_config, run_settings
from rljax.rewards import reward_model as reward_model_lib
from rljax.runs import run_dir as run_dir_lib
from rljax.runs.checkpoint import Checkpointer

RM_EXPORTS = reward_model_lib.STEP_EXPORTS  # an `rljax rm` run's export of each checkpoint
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ADAPTER_LIMIT = 1e4  # |x| of any factor of a trained adapter is far below this

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Loaded:
  """A loaded model: its architecture, its parameters (host arrays), its source and, for the
  roles that bring their own (``Role.tokenizer == 'own'``), its tokenizer."""
  cfg: ModelConfig
  params: Any
  source: ModelSource
  tokenizer: Any = None


# --- the source, the dtype, the tokenizer: one rule each -----------------------------------------

def source_text(config, r: Role, text: Optional[str] = None) -> str:
  """What names the role's model: ``text``, else its key's value; a judge's 'policy' is the
  policy's own source."""
  if text is None:
    text = _get(config, r.key)
  if r.policy_alias and text == "policy":
    text = config.model.source
  return text


def source_of(config, role: str, text: Optional[str] = None) -> ModelSource:
  """The role's source parsed; a value outside the grammar is one ``StartupError`` line naming
  the key."""
  r = role_of(role)
  return parse_source(source_text(config, r, text), r.key or "rljax.load's source", r.kinds,
                      bare_paths=r.bare_paths)


def dtypes(config, role: str, platform: Optional[str] = None) -> dict:
  """The one dtype rule: the role's own dtype key when set, else ``model.dtype``; weights in
  ``model.param_dtype``."""
  r = role_of(role)
  own = _get(config, r.dtype_key) if r.dtype_key else None
  return dict(dtype=own or compute_dtype(config.model.dtype, platform),
              param_dtype=config.model.param_dtype)


def check_tokenizer(who: str, tokenizer=None, *, cfg: Optional[ModelConfig] = None,
                    policy_cfg: Optional[ModelConfig] = None, run_dir: Optional[str] = None,
                    config=None, exact_vocab: bool = False) -> None:
  """The one tokenizer-compatibility check: a model reads this run's token ids only if it was
  trained with the same tokenizer. ``run_dir``: a run's ``config.json`` records it (another one
  scored 1.6% instead of 46.9%, silently), compared with ``config``'s ``data.tokenizer`` /
  ``data.chat_template``; ``cfg``: a model's vocabulary must hold ``tokenizer``'s ids (exactly
  ``policy_cfg``'s with ``exact_vocab``: logits compared position by position), its EOS and
  padding ``policy_cfg``'s. ``who``: the key and value, for the message."""
  if run_dir is not None and config is not None:
    saved = run_config(run_dir).data
    for key in ("tokenizer", "chat_template"):
      if key in saved and saved[key] != config.data[key]:
        raise RunDirError(
            f"{who}: the run was trained with data.{key}={saved[key]!r} (its config.json), this "
            f"config has data.{key}={config.data[key]!r}; drop that override or pass "
            f"--config.data.{key}={saved[key]}")
  if cfg is None:
    return
  want = policy_cfg.vocab_size if (exact_vocab and policy_cfg is not None) else None
  short = cfg.vocab_size < tokenizer.vocab_size or (want is not None and cfg.vocab_size != want)
  ids = policy_cfg and (cfg.eos_token_id, cfg.pad_token_id) != (policy_cfg.eos_token_id,
                                                                 policy_cfg.pad_token_id)
  if short or ids:
    theirs = (f"vocab {cfg.vocab_size} / eos {cfg.eos_token_id} / pad {cfg.pad_token_id}")
    ours = (f"vocab {want or tokenizer.vocab_size} / eos "
            f"{policy_cfg.eos_token_id if policy_cfg else tokenizer.eos_id} / pad "
            f"{policy_cfg.pad_token_id if policy_cfg else tokenizer.pad_id}")
    raise TokenizerError(f"{who} has another tokenizer than the run's ({theirs} vs {ours}): it "
                         "reads this run's token ids (data.tokenizer); use a model of the same "
                         "tokenizer")


# --- a run directory -----------------------------------------------------------------------------

def is_reward_model_run(run_dir: str) -> bool:
  """An ``rljax rm`` run (its checkpoints are exported to ``exports/<STEP>``; its data record
  fingerprints a pairs file from its start), not a policy run."""
  return (os.path.isdir(os.path.join(run_dir, RM_EXPORTS))
          or run_dir_lib.records_pairs(run_dir))


def is_score_model(source: ModelSource) -> bool:
  """Whether the source holds a reward model: a ``*ForSequenceClassification`` Hugging Face
  directory or an ``rljax rm`` run."""
  if source.kind == "run":
    return is_reward_model_run(source.path)
  if source.kind != "hf":
    return False
  archs = read_hf_config(source.path).get("architectures") or []
  return any(str(a).endswith(hf_lib.SEQUENCE_CLASSIFIER) for a in archs)


def run_step(source: ModelSource, who: str) -> int:
  """The checkpoint step ``run:DIR[@STEP]`` names: ``STEP``, else DIR's latest committed one."""
  run_config(source.path)  # an rljax run directory at all
  steps = run_dir_lib.committed_steps(source.path)
  if not steps:
    raise RunDirError(f"{who}: {source.path!r} holds no checkpoint (no committed step under "
                      "checkpoints/); train it first")
  if source.step is not None and source.step not in steps:
    raise RunDirError(f"{who}: {source.path!r} has no checkpoint of step {source.step}; its "
                      f"steps are {steps}")
  return steps[-1] if source.step is None else source.step


def check_run_kind(source: ModelSource, head: str, who: str) -> None:
  """A policy is read from a policy run, a reward model from an ``rljax rm`` run: the other kind
  is one line."""
  run_config(source.path)  # an rljax run directory at all
  rm_run = is_reward_model_run(source.path)
  if rm_run and head != "score":
    raise RunDirError(f"{who}: {source.path!r} is an `rljax rm` run (a reward model, no language "
                      "model head); name a policy run (rljax train / rljax sft), or use it as "
                      "reward.model.source")
  if not rm_run and head == "score":
    raise RunDirError(f"{who}: {source.path!r} is a policy run, not an `rljax rm` run (no "
                      f"{RM_EXPORTS}/ of a reward model)")


def read_run(source: ModelSource, config=None, *, head: str = "lm", merged: bool = True,
             who: Optional[str] = None) -> tuple[ModelConfig, Any]:
  """(ModelConfig, params) of the checkpoint ``run:DIR[@STEP]`` names (module docstring), on the
  host. A policy trained with low-rank adapters comes back merged, in its base architecture (its
  checkpoint holds the adapters; the base is read from the source pinned when it started); with
  ``merged=False`` as (its ModelConfig with the adapters, the adapter tree alone)."""
  who = who or f"run:{source.path}"
  check_run_kind(source, head, who)
  step = run_step(source, who)
  saved = config or run_config(source.path)
  if head == "score":
    return models.load_hf(os.path.join(source.path, RM_EXPORTS, str(step)), head="score")
  tokenizer = tokenizer_lib.load_tokenizer(saved.data.tokenizer, saved.data.chat_template)
  model_cfg = architecture(saved, "policy", tokenizer)
  shapes, _ = initial.abstract_state(saved, model_cfg)
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                         sharding=initial.single_device()), shapes)
  with Checkpointer(os.path.join(source.path, "checkpoints"), keep=1, read_only=True,
                    saved=state_lib.saved_part) as checkpointer:  # never writes
    state, extra = checkpointer.restore(step, abstract)
  params = jax.device_get(state.params)
  if not model_cfg.lora_rank:
    return model_cfg, params
  record = pin.check_record(saved, extra, f"run {source.path!r}")
  if not merged:
    return model_cfg, lora.split_adapters(params)[1]
  base = base_params(saved, tokenizer, record)
  return model_cfg.base, lora.merge_adapters(lora.join_adapters(base, params), model_cfg)


def base_params(config, tokenizer, record: Optional[dict]) -> Any:
  """The frozen base of a policy with adapters: its source as pinned in ``record``
  (``rljax.loading.pin``: a 'run:DIR' base is read at the step it started from, its fingerprint
  checked), else ``model.source`` as it reads now."""
  text = pin.pinned_source(config, record)
  _, params = _weights(config, role_of("reference"), tokenizer,
                       source_of(config, "reference", text))
  pin.check_fingerprint(record, params, config.model.source)
  return lora.split_adapters(params)[0]


# --- the architecture, the weights ----------------------------------------------------------------

def architecture(config, role: str, tokenizer=None, *, text: Optional[str] = None,
                 policy_cfg: Optional[ModelConfig] = None, platform: Optional[str] = None
                 ) -> ModelConfig:
  """The role's architecture without loading any weights (``rljax plan``, the abstract state):
  'tiny' and 'sft' the 'tiny' sizes of ``config.model`` (the cold start is trained with them, so
  they are known before it exists); 'hf:PATH' its config.json; 'run:DIR' its run's config."""
  r = role_of(role)
  source = source_of(config, role, text)
  if source.kind == "run":
    saved = run_config(source.path)
    if r.head == "score" and is_reward_model_run(source.path):
      cfg = ModelConfig.from_hf_dir(os.path.join(source.path, RM_EXPORTS,
                                                 str(run_step(source, source.text))))
    else:
      cfg = architecture(saved, "policy", tokenizer, platform=platform)
  elif source.kind in ("tiny", "sft"):
    cfg = _tiny(config, tokenizer, policy_cfg)
  else:
    cfg = ModelConfig.from_hf_dir(source.path)
  return _finish(config, r, cfg, platform)


def _finish(config, r: Role, cfg: ModelConfig, platform: Optional[str] = None) -> ModelConfig:
  """The role's dtype and the run's model settings applied; adapters only for the policy."""
  cfg = cfg.replace(**dtypes(config, r.name, platform))
  if r.settings:
    cfg = cfg.replace(**{**run_settings(config.model), **lora_settings(config.model, platform)})
  return cfg if r.adapters else cfg.base


def _tiny(config, tokenizer, policy_cfg: Optional[ModelConfig]) -> ModelConfig:
  """The 'tiny' sizes of ``config.model`` over the tokenizer's vocabulary (None: the policy's
  architecture when known, else ``data.tokenizer``'s)."""
  if tokenizer is None and policy_cfg is not None:
    return policy_cfg
  tokenizer = tokenizer or tokenizer_lib.load_tokenizer(config.data.tokenizer)
  return models.tiny_config(config.model, tokenizer.vocab_size, eos_token_id=tokenizer.eos_id,
                            pad_token_id=tokenizer.pad_id)


def hf_dir(config, source: ModelSource) -> Optional[str]:
  """The Hugging Face directory of an 'hf' or 'sft' source (None: 'tiny', or a run)."""
  return {"sft": config.sft.out_dir, "hf": source.path}.get(source.kind)


def _weights(config, r: Role, tokenizer, source: ModelSource, *,
             policy_cfg: Optional[ModelConfig] = None, seed: Optional[int] = None):
  """(ModelConfig, params) of the role's parsed ``source``, its dtype and settings applied."""
  who = f"{r.key or 'rljax.load'}={source.text!r}"
  if source.kind == "tiny":  # a fresh random model, adapters included for the policy
    cfg = _finish(config, r, _tiny(config, tokenizer, policy_cfg))
    seed = (config.seed if seed is None else seed) + r.seed_offset
    return cfg, transformer.init_params(cfg, seed=seed, head=r.head)
  if source.kind == "run":
    cfg, params = read_run(source, head=r.head, who=who)
    cfg = _finish(config, r, cfg)
    cast = lambda x: x.astype(cfg.param_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return cfg, jax.tree.map(lambda x: cast(np.asarray(x)), params)
  path = hf_dir(config, source)
  if not os.path.isdir(path):
    raise ModelFileError(f"{who}: {path} is not a directory")
  try:
    cfg, params = models.load_hf(path, head=r.head, **dtypes(config, r.name))
  except (ModelFileError, OSError) as e:
    raise ModelFileError(f"{who}: {e}") from None
  return _finish(config, r, cfg), params


def load(config, role: str, tokenizer=None, *, policy_cfg: Optional[ModelConfig] = None,
         text: Optional[str] = None, seed: Optional[int] = None) -> Loaded:
  """The role's model from its source (module docstring): architecture, host parameters and,
  for a role with its own tokenizer, that tokenizer. ``tokenizer``: the run's (``data.tokenizer``;
  for 'load', the one asked for or None); ``policy_cfg``: the policy's architecture, whose
  tokenizer a role that reads the run's ids must share; ``text``: the source instead of the
  role's key. A policy (``Role.adapters``) gets fresh adapters (B = 0) or
  ``model.lora.init_from``'s."""
  r = role_of(role)
  source = source_of(config, role, text)
  who = f"{r.key or 'rljax.load'}={source.text!r}"
  if r.tokenizer == "run" and source.kind == "run":
    check_tokenizer(who, tokenizer, run_dir=source.path, config=config)
  cfg, params = _weights(config, r, tokenizer, source, policy_cfg=policy_cfg, seed=seed)
  own = None
  if r.tokenizer == "own":
    own = own_tokenizer(config, r, source, tokenizer)
    if own.vocab_size > cfg.vocab_size:
      raise TokenizerError(
          f"{who}: its tokenizer has {own.vocab_size} ids, more than the model's vocabulary of "
          f"{cfg.vocab_size}: it is not the model's tokenizer"
          + (f" (set {r.tokenizer_key})" if r.tokenizer_key else ""))
  elif tokenizer is not None and source.kind != "tiny":
    check_tokenizer(who, tokenizer, cfg=cfg, policy_cfg=None if r.adapters else policy_cfg,
                    exact_vocab=r.exact_vocab)
  if r.adapters and source.kind != "tiny":
    params = lora.with_adapters(cfg, params, config.seed)
  return Loaded(cfg=cfg, params=params, source=source, tokenizer=own)


def own_tokenizer(config, r: Role, source: ModelSource, asked):
  """The tokenizer of a role that brings its own: the one asked for (``reward.model.tokenizer``;
  ``rljax.load``'s argument), else a run's ``data.tokenizer`` (a reward model's chat template
  setting must be ``reward.model.chat_template``), else for 'tiny' ``data.tokenizer`` (it is
  built over that vocabulary), else the tokenizer files of its directory (``rljax.load``: else
  'char')."""
  if r.tokenizer_key is None and asked is not None and not isinstance(asked, str):
    return asked  # a tokenizer object already (rljax.load of 'tiny')
  name = _get(config, r.tokenizer_key) if r.tokenizer_key else asked
  chat = bool(_get(config, r.chat_key)) if r.chat_key else None
  if source.kind == "run":
    saved = run_config(source.path).data
    if chat is not None and bool(saved.chat_template) != chat:
      raise StartupError(
          f"{r.key}={source.text!r} was trained with data.chat_template={saved.chat_template} "
          f"(its config.json); set {r.chat_key}={saved.chat_template}")
    chat = saved.chat_template if chat is None else chat
    name = name or saved.tokenizer
  if source.kind == "tiny":  # built over the run's own vocabulary
    name = name or config.data.tokenizer
  path = (os.path.join(source.path, RM_EXPORTS, str(run_step(source, r.key)))
          if source.kind == "run" and r.head == "score" else hf_dir(config, source))
  if not name:
    if path and any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
      name = path
    elif r.tokenizer_key:
      raise TokenizerError(f"{r.key}={source.text!r}: {path} holds no tokenizer files; name the "
                           f"reward model's tokenizer in {r.tokenizer_key} ('char' or a local "
                           "Hugging Face tokenizer directory)")
    else:
      name = "char"
  try:
    return tokenizer_lib.load_tokenizer(name, bool(chat))
  except TokenizerError as e:
    if not r.tokenizer_key:
      raise
    # Its messages name the run's own keys; these are the role's.
    raise TokenizerError(str(e).replace("data.tokenizer=", f"{r.tokenizer_key}=").replace(
        "data.chat_template=", f"{r.chat_key}=")) from None


def check_files(config, role: str, tokenizer=None, *, text: Optional[str] = None
                ) -> Optional[ModelConfig]:
  """What loading the role's model would refuse, from the files' headers in about a second,
  before a run dir is claimed: a missing or empty directory, an unsupported architecture, a
  truncated file, a wrong shape, another tokenizer, a run without the checkpoint named or of the
  other kind. Returns the architecture of an 'hf:' source (None: 'tiny', a run, or an 'sft' cold
  start that may be trained first)."""
  r = role_of(role)
  source = source_of(config, role, text)
  who = f"{r.key or 'rljax.load'}={source.text!r}"
  if source.kind in ("tiny", "sft"):
    return None
  if source.kind == "run":
    if r.tokenizer == "run" and tokenizer is not None:
      check_tokenizer(who, tokenizer, run_dir=source.path, config=config)
    check_run_kind(source, r.head, who)
    run_step(source, who)
    return None
  try:
    cfg = models.check_hf_dir(source.path, head=r.head)
  except ModelFileError as e:
    raise type(e)(f"{who}: {e}") from None
  if r.tokenizer == "run" and tokenizer is not None:
    check_tokenizer(who, tokenizer, cfg=cfg)
  elif r.tokenizer_key:  # its own tokenizer: readable, and not wider than its vocabulary
    own = own_tokenizer(config, r, source, None)
    if own.vocab_size > cfg.vocab_size:
      raise TokenizerError(f"{who}: its tokenizer has {own.vocab_size} ids, more than the "
                           f"model's vocabulary of {cfg.vocab_size}: it is not the model's "
                           f"tokenizer (set {r.tokenizer_key})")
  return cfg


def reward_model(config, policy_tokenizer, mesh):
  """The reward model of ``reward.model.*`` (role 'reward_model') placed on ``mesh``, ready to
  score the policy's rows (``rljax.rewards.reward_model``)."""
  loaded = load(config, "reward_model", policy_tokenizer)
  return reward_model_lib.reward_model(config, loaded, policy_tokenizer, mesh)


# --- adapters: model.lora.init_from ----------------------------------------------------------------

def adapter_source(text: str) -> ModelSource:
  """``model.lora.init_from``: a PEFT adapter directory (``hf:PATH`` or the bare path) or the
  adapters of a LoRA run's checkpoint (``run:DIR[@STEP]``)."""
  if isinstance(text, str) and text and not text.startswith(("hf:", "run:")):
    return ModelSource("hf", text, text=text)  # a bare path: checked as an adapter directory
  return parse_source(text, "model.lora.init_from", ("hf", "run"))


def check_adapters(config, cfg: ModelConfig) -> None:
  """``model.lora.init_from`` against the policy's architecture, from its header."""
  source = adapter_source(config.model.lora.init_from)
  who = f"model.lora.init_from={source.text!r}"
  if source.kind == "run":
    run_step(source, who)
    check_run_kind(source, "lm", who)
    if not run_config(source.path).model.get("lora", {}).get("rank", 0):
      raise RunDirError(f"{who}: {source.path!r} trained no adapters (model.lora.rank=0)")
    return
  try:
    peft.check_peft_adapter(source.path, cfg)
  except ModelFileError as e:
    raise type(e)(f"model.lora.init_from: {e}") from None
  dropout = peft.read_adapter_config(source.path).get("lora_dropout") or 0.0
  if dropout:
    logger.warning("%s: its lora_dropout=%s is not applied (rljax LoRA has no dropout): the "
                   "adapters train without it", who, dropout)


def load_adapters(config, cfg: ModelConfig) -> dict:
  """The adapter tree of ``model.lora.init_from`` for the policy ``cfg``; factors that are NaN,
  infinite or beyond ``ADAPTER_LIMIT`` are refused in one line naming the adapter."""
  check_adapters(config, cfg)
  source = adapter_source(config.model.lora.init_from)
  if source.kind == "run":
    _, adapters = read_run(source, merged=False, who=f"model.lora.init_from={source.text!r}")
  else:
    adapters = peft.load_peft_adapter(source.path, cfg)
  for path, x in jax.tree_util.tree_flatten_with_path(adapters)[0]:
    x = np.asarray(x, np.float32)
    if not np.all(np.isfinite(x)) or np.max(np.abs(x), initial=0.0) > ADAPTER_LIMIT:
      raise ModelFileError(
          f"model.lora.init_from={source.text!r}: the adapter's factor "
          f"{jax.tree_util.keystr(path)} holds NaN, infinite or huge values (|x| > "
          f"{ADAPTER_LIMIT:g}); every update would be skipped: export the adapter again")
  return adapters


def policy(config, tokenizer, *, with_init_from: bool = True, base: Optional[str] = None
           ) -> tuple[ModelConfig, Any]:
  """(ModelConfig, params) of the policy: ``model.source`` (``base``: the pinned source of a
  resumed run with adapters, ``rljax.loading.pin``), with fresh adapters or those of
  ``model.lora.init_from`` (not when ``with_init_from`` is False: adapters from a checkpoint)."""
  loaded = load(config, "policy", tokenizer, text=base)
  cfg, params = loaded.cfg, loaded.params
  if config.model.lora.rank and config.model.lora.init_from and with_init_from:
    params = lora.join_adapters(lora.split_adapters(params)[0], load_adapters(config, cfg))
  return cfg, params


def _get(config, key: str):
  node = config
  for part in key.split("."):
    node = node.get(part) if hasattr(node, "get") else node[part]
    if node is None:
      return None
  return node

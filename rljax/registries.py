"""Every registry of rljax, and the one way a registry is made, filled and read.

A *registry* is a family of interchangeable pieces, each registered under a name that a config
string picks: the algorithm components (``algo.advantage='rloo'``), the transforms, the rollout
engines (``rollout.engine``), the episode engines (``env.engine``), the reward functions
(``reward.fn``) and reward sources (``reward.sources``), the environments (``env.name``) and
their tools, the model families (``model.family``, HF ``model_type``), the loggers
(``train.loggers``), the data sources (``data.source='NAME:ARGS'``) and the embedded tasks
(``data.source='embedded:NAME'``). ``FAMILIES`` lists them; ``rljax components`` prints what
each holds.

**Registering.** A piece is registered by its family's decorator (``register_engine``,
``register_data_source``, ...: they check what that family needs, then call
``Registry.register``)::

  @register_engine("mine", reads=("rollout.max_concurrent_rows",))
  def mine(config, model_cfg, placement):
    ...

``reads`` names the config keys the piece reads that its family's other members do not: a key
declared ``read_if=chosen_reads("rollout.engine")`` (``rljax.config.declare``) is then read exactly
when the piece the config picks declares it, and a key set for a piece that is not picked is
refused naming the pieces that read it. Other facts a registration states (``order``,
``package``, ...) are kept with it (``meta``).

**Filling.** Each registry declares the modules that fill it (``fill``). They are imported, by
module path, the first time the registry is read (``names``, ``get``, ``meta``, ``in``), never
before; a package named there is scanned (every module directly in it is imported), so a piece
in such a package registers itself by existing, with no list to edit and no import kept for its
side effect. A registration from anywhere else (a notebook cell, a test file, a config file)
counts from the moment it runs. The modules are imported by path, so this module imports nothing
of rljax above it: it sits at the bottom, with the config package, which looks names up here.

**Reading.** ``get(name)`` of a name nothing registered is an ``UnknownNameError``, one line
naming the key and listing what is registered, so a typo in a config fails at start-up.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import threading
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from rljax.errors import UnknownNameError

_FILLING = threading.RLock()  # one registry filled at a time; a fill may read another registry


def signature_of(fn: Callable, hparams: Optional[Mapping[str, str]] = None
                 ) -> Tuple[Tuple[str, ...], Dict[str, str], Dict[str, Any]]:
  """``(inputs, {keyword: config key}, {keyword: default})`` of a component function.

  Inputs are the parameters that can be passed positionally; hyperparameters are the
  keyword-only ones, each read from the config key ``hparams`` names (default: its own name).
  Every keyword-only parameter is read from the config when the config has its key, default or
  not: a default applies only where the config has no such key (a notebook component's own
  setting), never instead of a value the config gives.
  """
  hparams = dict(hparams or {})
  inputs, keys, defaults = [], {}, {}
  for p in inspect.signature(fn).parameters.values():
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
      inputs.append(p.name)
    elif p.kind == p.KEYWORD_ONLY:
      keys[p.name] = hparams.pop(p.name, p.name)
      if p.default is not p.empty:
        defaults[p.name] = p.default
  if hparams:
    raise ValueError(f"{fn.__name__}: hparams names {sorted(hparams)}, which are not keyword-only "
                     "parameters of the function")
  return tuple(inputs), keys, defaults


def import_fill(path: str) -> None:
  """Imports the module ``path``; a package, with every module directly in it."""
  module = importlib.import_module(path)
  for info in pkgutil.iter_modules(getattr(module, "__path__", ())):
    importlib.import_module(f"{path}.{info.name}")


class Registry:
  """A named family of interchangeable pieces (module docstring).

  kind: the family's name in ``registered(kind)`` checks and in ``rljax components``.
  what: what a piece is, in messages ("rollout engine").
  key: the config key that picks a piece ('' when none: the tools an environment calls).
  fill: the modules (or packages, scanned) whose import registers the family's own pieces.
  signature: pieces are functions whose positional parameters are inputs and whose keyword-only
    parameters are hyperparameters (``signature_of``: ``meta`` gains ``inputs``, ``hparams``,
    ``defaults``; ``register(name, hparams={keyword: key})`` renames keys).
  name_rule: ``(regex, words)`` a name must match in full (default: any non-empty string).
  """

  def __init__(self, kind: str, what: str, key: str = "", *, fill: Sequence[str] = (),
               signature: bool = False, name_rule: Optional[Tuple[str, str]] = None):
    self.kind, self.what, self.key = kind, what, key
    self.fill, self.signature, self.name_rule = tuple(fill), signature, name_rule
    self._pieces: Dict[str, Any] = {}
    self._meta: Dict[str, Dict[str, Any]] = {}
    self._filled = not self.fill  # False until the fill modules were imported
    self._filling = False

  # --- registering -------------------------------------------------------------------------------

  def register(self, name: str, *, reads: Sequence[str] = (), **meta
               ) -> Callable[[Any], Any]:
    """Decorator adding its argument under ``name``; ``reads``: the config keys (dotted) only
    this piece of the family reads; ``meta``: other facts kept with it."""
    self._check_name(name)
    reads = tuple(reads)
    if not all(isinstance(k, str) and "." in k for k in reads):
      raise ValueError(f"{self.what} {name!r}: reads={reads!r} must be dotted config keys")

    def decorator(piece):
      if name in self._pieces:
        raise ValueError(f"{self.what} {name!r} is already registered")
      facts = dict(meta, reads=reads)
      if self.signature:
        inputs, keys, defaults = signature_of(piece, facts.pop("hparams", None))
        facts.update(inputs=inputs, hparams=keys, defaults=defaults)
      self._pieces[name], self._meta[name] = piece, facts
      return piece
    return decorator

  def _check_name(self, name) -> None:
    if not isinstance(name, str) or not name:
      raise ValueError(f"a {self.what} name must be a non-empty string, got {name!r}")
    if self.name_rule and not re.fullmatch(self.name_rule[0], name):
      raise ValueError(f"{self.what} name {name!r}: {self.name_rule[1]}")

  def unregister(self, name: str) -> None:
    """Removes ``name`` (a test, or a notebook re-running the cell that registered it)."""
    self.get(name)
    del self._pieces[name], self._meta[name]

  # --- reading -----------------------------------------------------------------------------------

  def _fill(self) -> None:
    if self._filled or self._filling:  # (filling: a fill module reads the registry it fills)
      return
    with _FILLING:
      if self._filled or self._filling:
        return
      self._filling = True
      try:
        for path in self.fill:
          import_fill(path)
        self._filled = True
      finally:
        self._filling = False

  def names(self) -> List[str]:
    self._fill()
    return sorted(self._pieces)

  def get(self, name: str) -> Any:
    self._fill()
    if name not in self._pieces:
      where = f" ({self.key})" if self.key else ""
      raise UnknownNameError(f"unknown {self.what} {name!r}{where}; registered: "
                             f"{', '.join(self.names())}")
    return self._pieces[name]

  def meta(self, name: str) -> Dict[str, Any]:
    """What ``name``'s registration states (always ``reads``)."""
    self.get(name)
    return dict(self._meta[name])

  def __contains__(self, name) -> bool:
    self._fill()
    return name in self._pieces

  def __getitem__(self, name: str) -> Any:
    return self.get(name)

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def items(self) -> List[Tuple[str, Any]]:
    return [(name, self._pieces[name]) for name in self.names()]

  def __repr__(self):
    return f"Registry({self.kind!r}, {sorted(self._pieces)})"


# --- the families --------------------------------------------------------------------------------

_ALGOS = ("rljax.algos",)
ADVANTAGES = Registry("advantage", "advantage estimator", "algo.advantage", fill=_ALGOS,
                      signature=True)
POLICY_LOSSES = Registry("policy_loss", "policy objective", "algo.policy_loss", fill=_ALGOS,
                         signature=True)
LOSS_AGGS = Registry("loss_agg", "loss aggregation", "algo.loss_agg", fill=_ALGOS, signature=True)
KL_ESTIMATORS = Registry("kl_estimator", "KL estimator", "algo.kl_estimator", fill=_ALGOS,
                         signature=True)
REGULARIZERS = Registry("regularizer", "regulariser", "algo.<name>_coef", fill=_ALGOS,
                        signature=True)
TRANSFORMS = Registry("transform", "transform", fill=("rljax.transforms",))
# Two kinds of engine: a rollout engine samples completions of prompts (rljax/rollout/engines.py);
# an episode engine is a multi-turn driver that wraps the run's rollout engine and runs whole
# episodes against an environment (rljax/envs/drivers.py).
ROLLOUT_ENGINES = Registry("rollout_engine", "rollout engine", "rollout.engine",
                           fill=("rljax.rollout",))
EPISODE_ENGINES = Registry("episode_engine", "episode engine (multi-turn driver)", "env.engine",
                           fill=("rljax.envs", "rljax.agents"))
REWARD_FNS = Registry("reward_fn", "reward function", "reward.fn",
                      fill=("rljax.rewards", "rljax.agents"))
# 'name:weight,...' in reward.sources: a name holds none of the separators (nor the metric's '/').
REWARD_SOURCES = Registry("reward_source", "reward source", "reward.sources",
                          fill=("rljax.rewards", "rljax.envs"),
                          name_rule=(r"[^:,/\s]+", "may not contain ':', ',', '/' or spaces"))
# Environments are stepped (rljax/envs/) or agent harnesses played through the endpoint
# (rljax/agents/).
ENVS = Registry("environment", "environment", "env.name", fill=("rljax.envs", "rljax.agents"))
# A compact call '<name ARGS>' names its tool in lowercase letters and digits.
TOOLS = Registry("tool", "tool", fill=("rljax.envs", "rljax.agents"),
                 name_rule=(r"[a-z][a-z0-9]*", "must be lowercase letters and digits"))
# Vision-language families sit in rljax/vision, above the network they extend.
MODEL_FAMILIES = Registry("model_family", "model family (HF model_type)", "model.family",
                          fill=("rljax.models.families", "rljax.vision.qwen2_5_vl",
                                "rljax.vision.gemma3_vl", "rljax.vision.qwen3_vl"))
LOGGERS = Registry("logger", "logger", "train.loggers", fill=("rljax.runs",))
# 'NAME:ARGS' in data.source: a name holds no ':'.
DATA_SOURCES = Registry("data_source", "data source", "data.source", fill=("rljax.data",),
                        name_rule=(r"[^:\s]+", "may not contain ':' or spaces"))
# The generated tasks of data.source='embedded:NAME' (environments pose their own).
TASKS = Registry("task", "embedded task", "data.source='embedded:NAME'",
                 fill=("rljax.data.tasks", "rljax.data.visual_tasks", "rljax.envs"))

FAMILIES: Dict[str, Registry] = {r.kind: r for r in (
    ADVANTAGES, POLICY_LOSSES, LOSS_AGGS, KL_ESTIMATORS, REGULARIZERS, TRANSFORMS,
    REWARD_FNS, REWARD_SOURCES, ROLLOUT_ENGINES, EPISODE_ENGINES, ENVS, TOOLS, DATA_SOURCES,
    TASKS, MODEL_FAMILIES, LOGGERS)}


def family(kind: str) -> Registry:
  """The registry of ``kind`` (a key of ``FAMILIES``)."""
  if kind not in FAMILIES:
    raise LookupError(f"no registry of {kind!r}; registries: {', '.join(FAMILIES)}")
  return FAMILIES[kind]

"""Start-up validation: the one walker that applies the key declarations of ``rljax/config/table.py``.

``check_config(config)`` is a pure function of the config: it raises one ``ConfigError`` naming
the key, its value and what is allowed, or returns None. It runs in well under a second (no model,
no data, no compilation), so a typo or a negative epsilon costs a second, not an SFT run and an
eval. In order:

1. every value against its key's ``check``;
2. every key set away from its default against its ``read_if``: a key nothing reads is an
   ``UnusedKeyError`` naming it and why (``algo.dual_clip_c=3.0 is not used by advantage 'grpo',
   policy_loss 'cispo'; it is read by policy_loss 'gspo', policy_loss 'ppo'``);
3. the ``RELATIONS`` between keys.

The registries the declarations name (``registered(...)``, ``component_reads``) fill themselves
the first time they are read (``rljax.registries``), so the checks see the package's pieces and
what a notebook or a test registered, and this module imports nothing above the config package.

A condition that looks at more than the config (the resolved algorithm, the model's architecture)
is applied by ``check_unused`` once that is known: ``rljax.algorithm.resolve`` passes the
algorithm, ``rljax.train.build`` the model. A key absent from the config is skipped (a config
saved by an older version).
"""
from __future__ import annotations

from typing import Any, Dict

from rljax.config.table import KEY_BY_NAME, KEYS
from rljax.config.relations import RELATIONS
from rljax.errors import ConfigError, UnknownComponentError, UnusedKeyError
from rljax.config.declare import Facts, commands_words

__all__ = ["ConfigError", "UnknownComponentError", "UnusedKeyError", "check_config",
           "check_overrides", "check_section", "check_unused", "check_eval_samples"]


def flat(config) -> Dict[str, Any]:
  """``{dotted key: value}`` of a ConfigDict or nested dict (the declared keys it has)."""
  out = {}
  for key in KEYS:
    node, present = config, True
    for part in key.name.split("."):
      if part not in node:
        present = False
        break
      node = node[part]
    if present:
      out[key.name] = node
  return out


def _fail(key: str, value, allowed: str) -> ConfigError:
  error = UnknownComponentError if KEY_BY_NAME[key].check.family else ConfigError
  return error(f"{key}={value!r} is not allowed: expected {allowed}")


def check_section(section: str, values) -> None:
  """The declared checks of one section (e.g. ``algo``) on a mapping of its keys, for callers
  that hold only that section (``rljax.algorithm.resolve`` of an ``algo`` dict)."""
  for key in KEYS:
    if key.section == section and (leaf := key.name[len(section) + 1:]) in values:
      if (allowed := key.check(values[leaf])) is not None:
        raise _fail(key.name, values[leaf], allowed)


def check_config(config, command: str | None = None, overrides=()) -> None:
  """Raise a ``ConfigError`` (one line: key, value, what is allowed or why it is not read) for
  the first bad value, unread key or broken relation that the config alone shows; with the
  ``command`` that runs it (``rljax <command>``), also for a command-line override (``overrides``:
  the dotted keys set) of a key the command does not read (``check_overrides``)."""
  values = flat(config)
  for name, value in values.items():
    if (allowed := KEY_BY_NAME[name].check(value)) is not None:
      raise _fail(name, value, allowed)
  if command is not None:
    check_overrides(command, config, overrides)
  facts = Facts(values)
  _check_read(facts)
  _check_relations(facts)


def check_overrides(command: str, config, names) -> None:
  """Refuse a ``--config.KEY`` override (``names``: the dotted keys the command line set) of a
  key that ``rljax <command>`` does not read (``Key.commands``), or reads only under a condition
  the config does not meet: one ``UnusedKeyError`` naming the key and who reads it. A config
  file's values are not refused here (one file serves several commands: a job's ``sft.*`` for
  ``rljax sft``, its ``model.lora.*`` for ``rljax train``)."""
  values = flat(config)
  for name in names:
    key = KEY_BY_NAME.get(name)
    if key is None:
      continue
    when = key.commands.get(command)
    if when is None:
      raise UnusedKeyError(f"--config.{name}: rljax {command} does not read {name}; it is read by "
                           f"{commands_words(key)} (rljax {command} --help lists what it reads)")
    facts = Facts(values)
    if facts.known(when.needs) and not when.test(facts, name):
      raise UnusedKeyError(f"--config.{name}: rljax {command} reads {name} only with "
                           f"{when.words(name)}: {when.why_not(facts, name)}")


def check_unused(config, algorithm=None, model=None) -> None:
  """The ``read_if`` conditions with the resolved ``algorithm`` and/or the ``model``
  architecture known (those that need them apply only then); the config-only ones again."""
  _check_read(Facts(flat(config), algorithm, model))


def _differs(name: str, value) -> bool:
  default = KEY_BY_NAME[name].default
  if isinstance(default, (list, tuple)) or isinstance(value, (list, tuple)):
    return tuple(value or ()) != tuple(default or ())
  return value != default


def _check_read(facts: Facts) -> None:
  for key in KEYS:
    if key.name not in facts.config or not facts.known(key.read_if.needs):
      continue
    value = facts[key.name]
    if not _differs(key.name, value):
      continue
    try:
      read = key.read_if.test(facts, key.name)
    except KeyError:  # a config saved before a key the condition looks at existed
      continue
    if not read:
      why = key.read_if.why_not(facts, key.name)
      if why.startswith("by "):  # named with the components that would read it
        why = (f" {why}. Set it back to {key.default!r} or switch on what reads it")
      else:
        why = f": {why}"
      raise UnusedKeyError(f"{key.name}={value!r} is not used{why}")


def _check_relations(facts: Facts) -> None:
  for relation in RELATIONS:
    if not facts.known(relation.needs):
      continue
    try:
      message = relation.broken(facts)
    except KeyError:  # a config saved before one of its keys existed
      continue
    if message is not None:
      raise (UnusedKeyError if relation.unused else ConfigError)(message)


MAX_EVAL_SAMPLES = 2 ** 16  # k of pass@k; the sampler's row count (k x a batch) stays in int32


def check_eval_samples(samples) -> None:
  """``rljax eval --samples K``: 1 <= K <= ``MAX_EVAL_SAMPLES``."""
  if isinstance(samples, bool) or not isinstance(samples, int) or not \
      1 <= samples <= MAX_EVAL_SAMPLES:
    raise ConfigError(f"eval --samples={samples!r} is not allowed: expected an integer >= 1 and "
                      f"<= {MAX_EVAL_SAMPLES}")

"""Config files and ``--config.key=value`` overrides (big_vision / ml_collections style).

A config file defines ``get_config()`` returning an ``ml_collections.ConfigDict``. Overrides
address existing keys only: an unknown key or a value of the wrong type is an error that names
the key (and, for unknown keys, lists the keys that exist there). The returned config is locked,
so code that reads a misspelt key fails too.
"""
from __future__ import annotations

import ast
import importlib.util
import os

import ml_collections

from rljax.errors import ConfigFileError, ConfigKeyError, ConfigTypeError, UsageError
from rljax.config.table import KEY_BY_NAME

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def call_file_function(path: str, function: str, kind: str = "config"):
  """Imports the Python file ``path`` and returns ``function()`` (``get_config`` of a config
  file, ``get_study`` of a study file)."""
  if not os.path.isfile(path):
    raise ConfigFileError(f"{kind} file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location(
      f"rljax_{kind}_{abs(hash(os.path.abspath(path)))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, function):
    raise ConfigFileError(f"{kind} file {path!r} has no {function}()")
  return getattr(module, function)()


def load_config_file(path: str) -> ml_collections.ConfigDict:
  config = call_file_function(path, "get_config")
  if not isinstance(config, ml_collections.ConfigDict):
    # Overrides, locking and the checks all need a ConfigDict; a dict would fail far from here.
    raise ConfigFileError(f"get_config() of config file {path!r} returned a "
                          f"{type(config).__name__}, not an ml_collections.ConfigDict: build it "
                          "on rljax.config() (or configs/base.py) and return that")
  return config


def _field_type(parent: ml_collections.ConfigDict, key: str):
  value = parent[key]
  if value is not None:
    return type(value)
  ref = parent.get_ref(key)
  return ref.get_type()


def parse_value(text: str, kind, key: str):
  """Parse ``text`` as a value of ``kind`` (the field's declared type)."""
  if kind is str:
    return text
  if kind is bool:
    low = text.lower()
    if low in _TRUE:
      return True
    if low in _FALSE:
      return False
    raise ConfigTypeError(f"--config.{key}: expected a bool (true/false), got {text!r}")
  if text.lower() in ("none", "null"):
    return None
  if kind is float and text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
    # A float the user meant, which literal_eval cannot read: rljax.config.checks then says what
    # is wrong with the value (e.g. optim.lr must be finite) instead of "expected float".
    return float(text)
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise ConfigTypeError(f"--config.{key}: expected {kind.__name__}, got {text!r}") from None
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if kind is tuple and isinstance(value, list):
    value = tuple(value)
  if kind is not None and not isinstance(value, kind):
    raise ConfigTypeError(f"--config.{key}: expected {kind.__name__}, got {text!r}")
  return value


def apply_override(config: ml_collections.ConfigDict, dotted: str, text: str) -> None:
  parts = dotted.split(".")
  node = config
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      where = ".".join(parts[:i]) or "<root>"
      known = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      raise ConfigKeyError(f"unknown config key {dotted!r}: {where!r} has no {part!r}; "
                     f"keys there: {known}")
    if i < len(parts) - 1:
      node = node[part]
  key = parts[-1]
  value = parse_value(text, _field_type(node, key), dotted)
  try:
    with node.unlocked():
      node[key] = value
  except TypeError as e:
    raise ConfigTypeError(f"--config.{dotted}: {e}") from None


def set_value(config: ml_collections.ConfigDict, dotted: str, value) -> None:
  """Sets an existing key ``a.b.c`` to a Python value (an int where a float is declared is
  accepted); an unknown key or a value of the wrong type is an error naming the key."""
  parent, key = dotted.rpartition(".")[::2] if "." in dotted else ("", dotted)
  node = config
  for part in [p for p in parent.split(".") if p]:
    if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
      raise KeyError(f"unknown config key {dotted!r}: no section {part!r}")
    node = node[part]
  if key not in node:
    raise KeyError(f"unknown config key {dotted!r}; keys there: {sorted(node.keys())}")
  kind = _field_type(node, key)
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if kind is tuple and isinstance(value, list):
    value = tuple(value)
  if value is not None and kind is not None and not isinstance(value, kind):
    raise TypeError(f"config key {dotted!r}: expected {kind.__name__}, got {value!r}")
  with node.unlocked():
    node[key] = value


def load_config(path: str, overrides: list[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
  config = load_config_file(path)
  for dotted, text in overrides:
    apply_override(config, dotted, text)
  config.lock()
  return config


def split_config_args(argv: list[str]) -> tuple[str | None, list[tuple[str, str]], list[str]]:
  """Pull ``--config PATH`` / ``--config=PATH`` and ``--config.a.b=v`` / ``--config.a.b v``
  out of ``argv``; returns (path, overrides, remaining args)."""
  path, overrides, rest = None, [], []
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg == "--config" or arg.startswith("--config="):
      if arg == "--config":
        given = _flag_value(argv, i, "a config file path, e.g. --config configs/algos/grpo.py")
        i += 2
      else:
        given, i = arg.split("=", 1)[1], i + 1
      if path is not None:  # the second file would replace the first, silently
        raise UsageError(f"--config given twice ({path!r}, then {given!r}): a command reads one "
                         "config file; start one file from the other with based_on() "
                         "(rljax.config.loader) and pass that")
      path = given
      continue
    if arg.startswith("--config."):
      body = arg[len("--config."):]
      if "=" in body:
        key, value = body.split("=", 1)
        i += 1
      else:
        value = _flag_value(argv, i, f"a value, e.g. {arg}=VALUE")
        key, i = body, i + 2
      overrides.append((key, value))
      continue
    rest.append(arg)
    i += 1
  return path, overrides, rest


def _flag_value(argv: list[str], i: int, wanted: str) -> str:
  """The argument after the flag ``argv[i]``; a missing one, or another flag in its place, is a
  usage error (a flag taken as the value would fail later and far less clearly)."""
  if i + 1 >= len(argv) or argv[i + 1].startswith("--config"):
    raise UsageError(f"{argv[i]} needs {wanted}")
  return argv[i + 1]


# Config files compose one way: a file starts from another by its path under the repository's
# configs/ (``based_on("algos/grpo.py")``) and changes what makes it different; a job that runs
# another algorithm takes that preset's algorithm sections (``swap_algorithm``).
CONFIGS_ROOT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
# The update schedule belongs to the job, not to the algorithm: a job that swaps its algorithm
# keeps how many epochs, minibatches and micro-batches each step's batch is trained in.
UPDATE_SCHEDULE = ("algo.epochs", "algo.minibatches", "algo.micro_batches")


def config_path(name: str) -> str:
  """The file ``configs/<name>`` of the repository (``name`` like ``"algos/grpo.py"``)."""
  if os.path.isabs(name) or not name.endswith(".py"):
    raise ConfigFileError(f"a config to start from is named by its path under configs/, e.g. "
                          f"'algos/grpo.py' or 'jobs/main.py'; got {name!r}")
  path = os.path.join(CONFIGS_ROOT, name)
  if not os.path.isfile(path):
    raise ConfigFileError(f"no config file configs/{name} (the configs root is {CONFIGS_ROOT}; "
                          "presets are under algos/, jobs/, studies/ and tasks/)")
  return path


def based_on(name: str = "base.py") -> ml_collections.ConfigDict:
  """The config of ``configs/<name>``, locked, for a config file to modify: a preset starts from
  ``base.py`` (the defaults) or another preset, a job from a preset, a study base from a job.
  Locked, so that a file that misspells a key fails instead of adding it."""
  config = load_config_file(config_path(name))
  config.lock()
  return config


def swap_algorithm(config: ml_collections.ConfigDict, preset: str,
                   sections: tuple[str, ...] = ("algo", "reward")) -> ml_collections.ConfigDict:
  """``config`` (a job) with the algorithm of ``configs/<preset>``: every key of the preset's
  ``sections`` replaces the job's, except the job's update schedule (``UPDATE_SCHEDULE``). The
  task, model, rollout and optimizer stay the job's, so the two differ only in the algorithm."""
  other = load_config_file(config_path(preset))
  for section in sections:
    for key, value in other[section].items():
      if f"{section}.{key}" not in UPDATE_SCHEDULE:
        config[section][key] = value
  return config


def reset(config: ml_collections.ConfigDict, *names: str) -> ml_collections.ConfigDict:
  """Sets the dotted keys ``names`` back to their declared defaults: a preset that switches off
  what its base switched on (e.g. the KL term) also clears the settings nothing reads any more
  (a key away from its default that nothing reads is an error at start-up)."""
  for name in names:
    *sections, leaf = name.split(".")
    node = config
    for section in sections:
      node = node[section]
    node[leaf] = KEY_BY_NAME[name].default
  return config

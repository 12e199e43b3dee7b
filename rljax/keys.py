"""How a config key is declared: default, allowed values, one line of documentation.

``rljax/defaults.py`` declares every key once with ``Key``; the defaults (``rljax.config()``),
the start-up checks (``rljax.config_checks``), ``rljax keys`` and ``docs/config.md`` are all
generated from those declarations. A check is a callable ``check(value) -> None | str`` (None
when the value is allowed, else what is allowed) that also knows the Python type of its values
(``type``, for keys whose default is None) and says what it allows (``allowed``).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Optional


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Check:
  """A predicate on a key's value: ``ok(value) -> bool``; ``allowed`` describes what passes."""
  ok: Callable[[Any], bool]
  allowed: str
  type: type
  family: str = ""  # a registry whose names are allowed (listed when a value fails)
  options: tuple = ()  # the values of a ``choice``

  def __call__(self, value) -> Optional[str]:
    if self.ok(value):
      return None
    if self.family:
      return f"a registered {self.family} name: {', '.join(registry_names(self.family))}"
    return self.allowed


def optional(check: Check) -> Check:
  """``check``, or None (the key's 'off' or 'derived' value)."""
  return Check(lambda v: v is None or check.ok(v), f"{check.allowed} (or None)", check.type)


def integer(lo: Optional[int] = None, hi: Optional[int] = None, *, also: tuple = ()) -> Check:
  """An integer in ``[lo, hi]`` (either bound may be None), or one of ``also``."""
  def ok(v):
    if _is_int(v) and v in also:
      return True
    return _is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
  bounds = " and ".join(b for b in (f">= {lo}" if lo is not None else "",
                                     f"<= {hi}" if hi is not None else "") if b)
  text = f"an integer{' ' + bounds if bounds else ''}" + "".join(f" or {a}" for a in also)
  return Check(ok, text, int)


def real(lo: Optional[float] = None, hi: Optional[float] = None, *, lo_open: bool = False,
         hi_open: bool = False) -> Check:
  """A finite real in the interval (open ends where ``*_open``)."""
  def ok(v):
    if not (_is_real(v) and math.isfinite(v)):
      return False
    if lo is not None and not (v > lo if lo_open else v >= lo):
      return False
    return hi is None or (v < hi if hi_open else v <= hi)
  left = "(-inf" if lo is None else ("(" if lo_open else "[") + f"{lo}"
  right = "inf)" if hi is None else f"{hi}" + (")" if hi_open else "]")
  where = f" in {left}, {right}" if (lo is not None or hi is not None) else ""
  return Check(ok, f"a finite number{where}", float)


def choice(*options) -> Check:
  kinds = {type(o) for o in options if o is not None}
  return Check(lambda v: v in options and type(v) in kinds | {type(None)},
               f"one of {list(options)}", str if str in kinds else next(iter(kinds)),
               options=options)


BOOL = Check(lambda v: isinstance(v, bool), "True or False", bool)
STRING = Check(lambda v: isinstance(v, str), "a string", str)
NONEMPTY = Check(lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string", str)
POSITIVE = real(0, lo_open=True)
NONNEG = real(0)
FRACTION = real(0, 1)
ADAM_BETA = real(0, 1, hi_open=True)
SEED = integer(0, 2**32 - 1)  # seeds feed numpy and jax.random, which take 32-bit integers
SIZE = integer(1, 2**31 - 1)  # sizes feed XLA shapes, which are 32-bit on most backends
KEY_TUPLE = Check(lambda v: isinstance(v, (tuple, list)) and all(isinstance(k, str) for k in v),
                  "a tuple of dotted key names", tuple)


def _pass_rate_window(v) -> bool:
  return (isinstance(v, (tuple, list)) and len(v) == 2 and all(map(_is_real, v))
          and 0 <= v[0] <= v[1] <= 1)


PASS_RATE_WINDOW = optional(Check(_pass_rate_window, "(lo, hi) with 0 <= lo <= hi <= 1", tuple))


def registered(family: str) -> Check:
  """A name in one of the registries (``rljax components`` lists them); looked up when checked,
  so components registered by a config file or a notebook count."""
  def ok(v):
    return isinstance(v, str) and v in registry_names(family)
  return Check(ok, f"a registered {family} name (`rljax components`)", str, family)


def registry_names(family: str) -> list:
  if family == "reward_fn":
    from rljax.rewards import verifiers
    return verifiers.REWARD_FNS.names()
  if family == "rollout_engine":
    from rljax.rollout import engines
    return engines.ENGINES.names()
  from rljax.algos.registry import list_registries
  return list_registries()[family]


@dataclasses.dataclass(frozen=True)
class Key:
  """One config key: its dotted name, default, check and one-line doc."""
  name: str
  default: Any
  check: Check
  doc: str

  @property
  def section(self) -> str:
    return self.name.split(".")[0] if "." in self.name else ""


def _declared():
  from rljax.defaults import KEYS
  return KEYS


def _allowed(key: Key) -> str:
  if key.check.family:
    return f"a registered name: {', '.join(registry_names(key.check.family))}"
  return key.check.allowed


def text_table(prefix: str = "") -> str:
  """``rljax keys``: one block per key."""
  return "\n".join(f"{k.name} = {k.default!r}\n    {k.doc}\n    allowed: {_allowed(k)}"
                   for k in _declared() if k.name.startswith(prefix))


def markdown_table() -> str:
  """``docs/config.md``, generated from the declarations (a test keeps the file in step)."""
  lines = ["# Config keys", "",
           "Generated from `rljax/defaults.py` by `python -m rljax keys --markdown`; do not edit.",
           "Override any key with `--config.KEY=VALUE`.", ""]
  section = None
  for k in _declared():
    if k.section != section:
      section = k.section
      lines += ["", f"## {section or 'top level'}", "", "| key | default | allowed | what |",
                "|---|---|---|---|"]
    cell = lambda text: str(text).replace("|", "\\|")
    # Registered names are listed by `rljax components` (plugins and notebooks add more).
    lines.append(f"| `{k.name}` | `{k.default!r}` | {cell(k.check.allowed)} | {cell(k.doc)} |")
  return "\n".join(lines) + "\n"

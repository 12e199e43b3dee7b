"""How a config key is declared: default, allowed values, when it is read, one line of doc.

``rljax/config/table.py`` declares every key once with ``Key`` and the constraints between keys with
``Relation``; the defaults (``rljax.config()``), the start-up checks (``rljax.config.checks``),
``rljax keys`` and ``docs/config.md`` are all generated from those declarations.

- A ``Check`` is a callable ``check(value) -> None | str`` (None when the value is allowed, else
  what is allowed) that also knows the Python type of its values (``type``, for keys whose
  default is None) and says what it allows (``allowed``).
- A ``When`` is a condition on the run (``Facts``: the config's values by dotted name, and once
  resolved the algorithm and the model's architecture): ``Key.read_if`` says when a key is read,
  and a key set away from its default while its condition is false is refused by name.

This module is the bottom of the package: it imports nothing of it but the registries
(``rljax.registries``, beside it at the bottom), so a declaration can say "a registered
advantage" and a key can be read by the registered piece that a config string picks
(``chosen_reads``).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import types
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from rljax import registries


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
  # ``names(value) -> tuple``: the registered names an allowed value of a ``family`` key picks
  names: Optional[Callable[[Any], tuple]] = None
  options: tuple = ()  # the values of a ``choice``
  # ``why(value) -> None | str``: what exactly is wrong with a value ``ok`` refuses (``parsed``)
  why: Optional[Callable[[Any], Optional[str]]] = None

  def __call__(self, value) -> Optional[str]:
    if self.ok(value):
      return None
    if self.why is not None:
      return self.why(value) or self.allowed
    if self.family:
      names = f"a registered {self.family} name: {', '.join(registry_names(self.family))}"
      return f"None or {names}" if self.ok(None) else names
    return self.allowed


def optional(check: Check) -> Check:
  """``check``, or None (the key's 'off' or 'derived' value)."""
  names = None if check.names is None else (lambda v: () if v is None else check.names(v))
  return Check(lambda v: v is None or check.ok(v), f"{check.allowed} (or None)", check.type,
               check.family, names, check.options)


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


def parsed(parse: Callable[[Any], Any], allowed: str, type_: type = str) -> Check:
  """A value that ``parse(value)`` accepts; the ``ValueError`` it raises for one it refuses is
  what the error says (e.g. which term of a ``'name:weight,...'`` list is wrong)."""
  def why(value) -> Optional[str]:
    try:
      parse(value)
    except ValueError as e:
      return f"{allowed} ({e})"
    return None
  return Check(lambda v: why(v) is None, allowed, type_, why=why)


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
    return isinstance(v, str) and v in registries.family(family)
  return Check(ok, f"a registered {family} name (`rljax components`)", str, family,
               lambda v: (v,))


def registered_spec(family: str, example: str) -> Check:
  """``'NAME:ARGS'``: a registered ``NAME`` (e.g. a data source) and a non-empty ``ARGS``."""
  def why(v) -> Optional[str]:
    name, sep, arg = v.partition(":") if isinstance(v, str) else ("", "", "")
    if not (sep and arg):
      return f"'NAME:ARGS' with NAME a registered {family}, e.g. {example!r}"
    if name not in registries.family(family):
      return (f"'NAME:ARGS' with NAME a registered {family}: "
              f"{', '.join(registry_names(family))}")
    return None
  return Check(lambda v: why(v) is None, f"'NAME:ARGS', NAME a registered {family} name "
               "(`rljax components`)", str, family, lambda v: (v.partition(":")[0],), why=why)


def registered_tuple(family: str, *, required: Tuple[str, ...] = ()) -> Check:
  """A tuple of distinct registered names that includes ``required``."""
  must = "".join(f" that includes {r!r}" for r in required)
  def why(v) -> Optional[str]:
    if not (isinstance(v, (tuple, list)) and all(isinstance(n, str) for n in v)):
      return f"a tuple of registered {family} names{must}"
    unknown = [n for n in v if n not in registries.family(family)]
    if unknown:
      return (f"{unknown} not registered; registered {family} names: "
              f"{', '.join(registry_names(family))}")
    if len(set(v)) != len(v) or not set(required) <= set(v):
      return f"a tuple of distinct registered {family} names{must}"
    return None
  return Check(lambda v: why(v) is None, f"a tuple of distinct registered {family} names{must} "
               "(`rljax components`)", tuple, family, tuple, why=why)


def registry_names(family: str) -> list:
  return registries.family(family).names()


def registry_meta(family: str, name: str) -> dict:
  """What ``name`` registered in ``family`` declares (its inputs, hyperparameters, reads)."""
  return registries.family(family).meta(name)


# --- when a key is read --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Facts:
  """What a condition may look at: ``config`` (value by dotted name), and, once they are known,
  the resolved ``algorithm`` (``rljax.algorithm.Algorithm``) and the policy's ``model``
  architecture (``rljax.models.ModelConfig``)."""
  config: Mapping[str, Any]
  algorithm: Any = None
  model: Any = None

  def __getitem__(self, name: str):
    return self.config[name]

  def known(self, needs: frozenset) -> bool:
    return all(getattr(self, fact) is not None for fact in needs)


@dataclasses.dataclass(frozen=True)
class When:
  """A condition on the run: ``test(facts, key) -> bool`` (``key``: the dotted name of the key it
  is the ``read_if`` of); ``says``: the condition in words (docs, "it is read with ..."), or
  ``f(key) -> words`` when they depend on what is registered (``chosen_reads``; ``words(key)``);
  ``unless``: why the key is not read when it is false (a string or ``f(facts, key) -> str``);
  ``needs``: the facts beyond the config it looks at ('algorithm', 'model'), so the walker
  applies it once they are known. ``a & b``, ``a | b`` combine conditions."""
  test: Callable[[Facts, str], bool]
  says: Any
  unless: Any = None
  needs: frozenset = frozenset()
  parts: tuple = ()  # of an ``a & b``: the first part that is false says why
  components: bool = False  # a resolved component reads the key (``component_reads``)

  def words(self, key: str) -> str:
    return self.says(key) if callable(self.says) else self.says

  def why_not(self, facts: Facts, key: str) -> str:
    for part in self.parts:
      if not part.test(facts, key):
        return part.why_not(facts, key)
    if callable(self.unless):
      return self.unless(facts, key)
    return self.unless or f"it is read only with {self.words(key)}"

  def __and__(self, other: "When") -> "When":
    says = lambda k: " and ".join(f"({w})" if " or " in w else w
                                  for w in (self.words(k), other.words(k)))
    return When(lambda f, k: self.test(f, k) and other.test(f, k), says, None,
                self.needs | other.needs, (self, other))

  def __or__(self, other: "When") -> "When":
    unless = self.unless or other.unless
    if self.components or other.components:  # the components named, and the other condition
      unless = lambda f, k: _component_message(
          f, k, [p.words(k) for p in (self, other) if not p.components])
    says = lambda k: " or ".join(f"({w})" if " and " in w else w
                                 for w in (self.words(k), other.words(k)))
    return When(lambda f, k: self.test(f, k) or other.test(f, k), says, unless,
                self.needs | other.needs,
                components=self.components or other.components)


ALWAYS = When(lambda f, k: True, "always")


def equals(name: str, value, unless=None) -> When:
  return When(lambda f, k: f[name] == value, f"{name}={value!r}", unless)


def differs(name: str, value, unless=None) -> When:
  return When(lambda f, k: f[name] != value, f"{name} != {value!r}", unless)


def above(name: str, bound, unless=None) -> When:
  return When(lambda f, k: f[name] > bound, f"{name} > {bound!r}", unless)


_KEY_CHECKS: Dict[str, Check] = {}  # filled by ``declare``: key naming registered pieces -> check


def meta_says(name: str, test: Callable[[dict], bool], says: str, unless=None) -> When:
  """The component that the key ``name`` (a ``registered`` key) names declares ``test(meta)``."""
  return When(lambda f, k: test(registry_meta(_KEY_CHECKS[name].family, f[name])), says, unless)


def chosen_reads(selector: str, family: str = "",
                 names: Optional[Callable[[Any], Sequence[str]]] = None) -> When:
  """The piece that the key ``selector`` picks (a ``registered...`` key: ``rollout.engine``,
  ``data.source``, ``train.loggers``; or any key, given its ``family`` and ``names(value)``, the
  names a value picks) declares that it reads the key (its registration's ``reads``). Unread, the
  key is named with the pieces that would read it."""
  def family_of() -> str:
    return family or _KEY_CHECKS[selector].family

  def reads(f: Facts, key: str) -> bool:
    picked = (names or _KEY_CHECKS[selector].names)(f[selector])
    return any(key in registry_meta(family_of(), name)["reads"] for name in picked)

  def readers(key: str) -> list:
    return [n for n in registry_names(family_of())
            if key in registry_meta(family_of(), n)["reads"]]

  def unless(f: Facts, key: str) -> str:
    what = registries.family(family_of()).what
    named = [f"{what} '{n}'" for n in readers(key)]
    return (f"{selector}={f[selector]!r} does not read it"
            + (f"; it is read by {', '.join(named)}" if named else ""))
  return When(reads, lambda key: f"{selector} naming {' or '.join(map(repr, readers(key)))}",
              unless)


def component_reads() -> When:
  """The key (``algo.*``) is a hyperparameter that a component the config resolved to binds:
  an advantage estimator, the objective, a regulariser, a transform (their registrations say
  which keys they read). Unread, it is named with the components that would read it."""
  return When(lambda f, k: k.split(".", 1)[1] in f.algorithm.keys_read,
              "a resolved component reads it", _component_message, frozenset({"algorithm"}),
              components=True)


def _component_message(f: Facts, key: str, also: Sequence[str] = ()) -> str:
  """'by advantage 'grpo', policy_loss 'cispo'; it is read by policy_loss 'ppo', ...'."""
  leaf = key.split(".", 1)[1]
  described = (f"advantage {f['algo.advantage']!r}, policy_loss {f['algo.policy_loss']!r}"
               + "".join(f", transform {t.name!r}" for t in f.algorithm.transforms))
  readers = []
  for family, label in (("advantage", "advantage"), ("policy_loss", "policy_loss"),
                        ("regularizer", "regulariser"), ("transform", "transform")):
    for name in registry_names(family):
      meta = registry_meta(family, name)
      if (leaf in meta.get("hparams", {}).values() or meta.get("coef") == leaf
          or key in meta["reads"]):
        readers.append(f"{label} '{name}'")
  readers += list(also)
  return f"by {described}" + (f"; it is read by {', '.join(readers)}" if readers else "")


# --- what a key changes, and which commands read it ----------------------------------------------

# A key's effect: what a different value changes. Resume (``rljax.runs.run_dir``), sweep
# aggregation (``rljax.sweep.runner``) and the SFT cold start's stamp (``rljax.train.sft``) derive
# which keys they compare from it (``rljax.config.effects``).
RESULT = "result"
EXTENT = "extent"
MEASURE = "measure"
LAYOUT = "layout"
BOOKKEEPING = "bookkeeping"
EFFECTS = {
    RESULT: "changes the numbers a run produces: a resume refuses a change, a sweep compares it",
    EXTENT: "how far the run trains (its steps): a resume may extend it, never shorten it",
    MEASURE: "changes only what is measured (held-out evaluation): a resume accepts a change, a "
             "sweep compares it",
    LAYOUT: "how the same numbers are computed (sharding, chunking, caches, worker processes and "
            "their bounds): a resume accepts a change, a sweep ignores it",
    BOOKKEEPING: "where and how the run records itself (paths, checkpoints, logging, progress): "
                 "a resume accepts a change, a sweep ignores it",
}

# The commands that take a config (``rljax <command> --config ...``). A key names the ones that
# read it and when (``Key.commands``); the command line may set only a key its command reads
# (``rljax.config.checks.check_overrides``).
COMMANDS = ("train", "eval", "plan", "sft", "rm")


def reads(*commands: str, **when: "When") -> Mapping[str, "When"]:
  """``Key.commands``: ``commands`` read the key always, ``name=WHEN`` under ``WHEN``."""
  return types.MappingProxyType({**{c: ALWAYS for c in commands}, **when})


RL_COMMANDS = reads("train", "eval", "plan")  # a key of the RL run (the default)


@dataclasses.dataclass(frozen=True)
class Key:
  """One config key: its dotted name, default, check, one-line doc, when it is read
  (``read_if``: any value away from the default is refused when it is false), its ``effect``
  (``EFFECTS``) and the ``commands`` that read it (``reads(...)``; a command-line override for
  another command is refused)."""
  name: str
  default: Any
  check: Check
  doc: str
  read_if: When = ALWAYS
  effect: str = RESULT
  commands: Mapping[str, When] = dataclasses.field(default_factory=lambda: RL_COMMANDS,
                                                   hash=False, compare=False)

  @property
  def section(self) -> str:
    return self.name.split(".")[0] if "." in self.name else ""


@dataclasses.dataclass(frozen=True)
class Relation:
  """A constraint between ``keys``: ``broken(facts) -> None | str`` returns the one-line error
  (naming the keys and their values) when the combination cannot run; ``says``: the rule in
  words (docs); ``unused``: the error is an ``UnusedKeyError`` (a key that would be ignored)."""
  keys: Tuple[str, ...]
  says: str
  broken: Callable[[Facts], Optional[str]]
  needs: frozenset = frozenset()
  unused: bool = False


def declare(keys: Sequence[Key]) -> Tuple[Key, ...]:
  """The declarations, checked once: names unique, defaults allowed by their checks."""
  seen = set()
  for key in keys:
    if key.name in seen:
      raise ValueError(f"config key {key.name!r} is declared twice")
    seen.add(key.name)
    if key.effect not in EFFECTS:
      raise ValueError(f"config key {key.name!r}: effect {key.effect!r} is not one of "
                       f"{sorted(EFFECTS)}")
    if not set(key.commands) <= set(COMMANDS):
      raise ValueError(f"config key {key.name!r}: commands {sorted(key.commands)} are not all "
                       f"of {list(COMMANDS)}")
    if key.check.family:
      _KEY_CHECKS[key.name] = key.check
  return tuple(keys)


# --- tables --------------------------------------------------------------------------------------

def _allowed(key: Key) -> str:
  if key.check.family:
    return f"a registered name: {', '.join(registry_names(key.check.family))}"
  return key.check.allowed


def commands_words(key: Key) -> str:
  """``'sft; train, rm with model.source='sft''``: the commands that read ``key`` always, then
  those that read it under a condition, grouped by the condition."""
  groups: Dict[str, list] = {}
  for command in COMMANDS:
    when = key.commands.get(command)
    if when is not None:
      groups.setdefault("" if when is ALWAYS else when.words(key.name), []).append(command)
  return "; ".join(", ".join(names) + (f" with {words}" if words else "")
                   for words, names in sorted(groups.items(), key=lambda item: item[0] != ""))


def text_table(declared: Sequence[Key], prefix: str = "") -> str:
  """``rljax keys``: one block per key."""
  return "\n".join(
      f"{k.name} = {k.default!r}\n    {k.doc}\n    allowed: {_allowed(k)}"
      + ("" if k.read_if is ALWAYS else f"\n    read with: {k.read_if.words(k.name)}")
      + f"\n    effect: {k.effect}; read by: {commands_words(k)}"
      for k in declared if k.name.startswith(prefix))


def markdown_table(declared: Sequence[Key], relations: Sequence[Relation] = ()) -> str:
  """``docs/config.md``, generated from the declarations (a test keeps the file in step)."""
  lines = ["# Config keys", "",
           "Generated from the key table (`rljax/config/sections/`, listed by "
           "`rljax/config/table.py`) by `python -m rljax keys --markdown`; do not edit.",
           "Override any key with `--config.KEY=VALUE`. A key set away from its default is read "
           "only under its *read with* condition; otherwise the run stops naming it. *read by*: "
           "the commands that read it (`rljax <command> --help` lists them); the command line may "
           "set a key only for a command that reads it.", "",
           "*effect*, what another value changes (a resume and a sweep compare runs by it):", ""]
  lines += [f"- `{name}`: {words}" for name, words in EFFECTS.items()]
  section = None
  cell = lambda text: str(text).replace("|", "\\|")
  for k in declared:
    if k.section != section:
      section = k.section
      lines += ["", f"## {section or 'top level'}", "",
                "| key | default | allowed | read with | effect | read by | what |",
                "|---|---|---|---|---|---|---|"]
    # Registered names are listed by `rljax components` (plugins and notebooks add more).
    read = "" if k.read_if is ALWAYS else cell(k.read_if.words(k.name))
    lines.append(f"| `{k.name}` | `{k.default!r}` | {cell(k.check.allowed)} | {read} | "
                 f"{k.effect} | {cell(commands_words(k))} | {cell(k.doc)} |")
  if relations:
    lines += ["", "## Between keys", "", "Checked at start-up, before anything is built.", ""]
    lines += [f"- {', '.join(f'`{name}`' for name in r.keys)}: {r.says}" for r in relations]
  return "\n".join(lines) + "\n"

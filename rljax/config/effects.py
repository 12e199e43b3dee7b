"""What follows from each key's declared ``effect`` and ``commands`` (``rljax.config.declare``).

- ``resumable(name)``: a resume may change the key (every effect but ``RESULT``; an ``EXTENT``
  key may only grow, which ``rljax.runs.run_dir.check_start`` checks);
- ``same_result(name)``: two runs that differ only in such keys produced the same numbers
  (``LAYOUT``, ``BOOKKEEPING``): a sweep compares runs without them;
- ``read_by(command, name, values)``: the command reads the key (with the config's ``values``
  for a conditional reader); ``command_keys(command)``: the keys it may read.

Looked up when asked, in ``KEY_BY_NAME``: a key declared later (a plugin, a test) counts. A key no
longer declared (a run saved by an older version) counts as ``RESULT``, never resumable.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from rljax.config.declare import (BOOKKEEPING, LAYOUT, RESULT, Facts, Key, When)
from rljax.config import table


def effect(name: str) -> str:
  key = table.KEY_BY_NAME.get(name)
  return RESULT if key is None else key.effect


def resumable(name: str) -> bool:
  """A resume may change ``name``: it does not change the numbers the run produced so far."""
  return effect(name) != RESULT


def same_result(name: str) -> bool:
  """Runs that differ in ``name`` only computed the same numbers (how, where it was written)."""
  return effect(name) in (LAYOUT, BOOKKEEPING)


def reader(command: str, name: str) -> Optional[When]:
  """The condition under which ``command`` reads the key ``name`` (None: it never does)."""
  key = table.KEY_BY_NAME.get(name)
  return None if key is None else key.commands.get(command)


def read_by(command: str, name: str, values: Optional[Mapping[str, Any]] = None) -> bool:
  """Whether ``command`` reads ``name``; with the config's ``values`` ({dotted: value}) a
  conditional reader's condition is applied, without them it counts as reading."""
  when = reader(command, name)
  if when is None:
    return False
  return values is None or when.test(Facts(values), name)


def command_keys(command: str) -> tuple[Key, ...]:
  """The keys ``command`` may read (under their conditions), in table order."""
  return tuple(k for k in table.KEYS if command in k.commands)


def sft_stamp_keys() -> tuple[str, ...]:
  """What the SFT cold start depends on (``rljax.train.sft.cold_start_stamp``): the ``sft``,
  ``model`` and ``data`` keys that ``rljax sft`` reads, except where it writes them."""
  return tuple(k.name for k in command_keys("sft") if k.section in ("sft", "model", "data")
               and k.effect != BOOKKEEPING)

"""Data sources: where a run's prompts come from, chosen by ``data.source='NAME:ARGS'``.

A data source is registered by name in ``DATA_SOURCES`` (``rljax.registries``: every module of
``rljax.data`` is imported the first time it is read, so a source in this package registers
itself by existing; one registered in a notebook or a test file counts once its cell has run)::

  @register_data_source("lines", reads=("data.difficulty",), files=lambda arg: [arg])
  def lines(arg: str, settings) -> Rows:
    with open(arg) as f:
      return Rows([Problem(prompt=line.strip(), answer="") for line in f])

Then ``data.source='lines:prompts.txt'`` trains on it (``rljax train``, ``rljax sft``, eval).

- ``factory(arg, settings)``: ``arg`` is what follows the first ``':'`` (never empty);
  ``settings`` the ``data`` section as a plain dict, every declared default filled in
  (``settings["difficulty"]``, ``settings["reasoning_gym"]["weights"]``: ``data_settings``).
- It returns a *generated task* (a ``rljax.data.tasks.Task``: ``problem_at(seed, index)``, an
  infinite train stream per ``data.train_seed``, and ``eval_set(seed, n)``, held-out problems per
  ``data.eval_seed``), or ``Rows``: a finite list of problems, reshuffled every epoch, whose
  held-out part is the prompts ``is_eval_prompt`` picks by a hash unless the source gives its own
  (``held_out``). Rows read from files go through ``screen_rows`` (``data.invalid_rows``).
- ``reads``: the ``data.*`` keys only this source reads; with another source picked they must
  keep their defaults (the key table declares them ``read_if=DATA_SOURCE_READS``), and a key set
  for a source that is not picked is refused naming the sources that read it.
- ``files``: ``files(arg) -> paths``, the files it reads: a resumed run checks their sha256
  (``fingerprint``). Sources built by code have none.

Registered: ``embedded`` (``rljax.data.tasks``), ``reasoning_gym``
(``rljax.data.reasoning_gym_tasks``), ``code`` (``rljax.data.code_tasks``), ``jsonl`` and ``hf``
(``rljax.data.datasets``). A name that is not registered is an error listing those
that are, from the config check, before anything is built.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable, Mapping, Optional, Sequence

from rljax.config import table
from rljax.errors import DataError
from rljax.registries import DATA_SOURCES

SECTION = "data"


@dataclasses.dataclass(frozen=True)
class Rows:
  """A finite source's problems: ``rows`` (train and held out alike, unless ``held_out`` gives
  the held-out problems apart) and how many rows ``screen_rows`` left out (``invalid_rows``)."""
  rows: list
  held_out: Optional[list] = None
  invalid_rows: int = 0


def register_data_source(name: str, *, reads: Sequence[str] = (),
                         files: Optional[Callable[[str], Sequence[str]]] = None) -> Callable:
  """``@register_data_source("name")`` on ``factory(arg, settings) -> Task | Rows`` (module
  docstring): selectable as ``data.source='name:ARGS'``."""
  return DATA_SOURCES.register(name, reads=reads, files=files)


def parse_data_source(text: str) -> tuple[str, str]:
  """``'jsonl:data/x.jsonl'`` -> ``('jsonl', 'data/x.jsonl')``: a registered name and its
  (non-empty) argument."""
  name, sep, arg = text.partition(":") if isinstance(text, str) else ("", "", "")
  if not (sep and arg):
    raise DataError(f"data.source={text!r} must be 'NAME:ARGS' with NAME one of "
                    f"{', '.join(DATA_SOURCES.names())}, e.g. 'embedded:arithmetic' or "
                    "'jsonl:data/train.jsonl'")
  DATA_SOURCES.get(name)
  return name, arg


def _defaults() -> dict:
  out: dict = {}
  for key in table.KEYS:
    if key.section == SECTION:
      *parents, leaf = key.name.split(".")[1:]
      node = out
      for part in parents:
        node = node.setdefault(part, {})
      node[leaf] = key.default
  return out


def data_settings(data: Optional[Mapping[str, Any]] = None, **overrides) -> dict:
  """The ``data`` section as a plain dict: ``data`` (a ConfigDict or mapping, e.g. ``config.data``;
  keys it lacks, from a config saved before they existed, get their declared defaults), then
  ``overrides`` by leaf name (``difficulty=0``, ``reasoning_gym={'weights': ...}``); a name the
  key table does not declare is an error."""
  settings = _defaults()
  for source in (dict(data or {}), overrides):
    for leaf, value in source.items():
      if leaf not in settings:
        raise DataError(f"data.{leaf} is not a config key; data keys: {', '.join(settings)}")
      if isinstance(settings[leaf], dict):
        value = {**settings[leaf], **dict(value or {})}
      settings[leaf] = value
  return settings


def open_data_source(text: str, settings: Optional[Mapping[str, Any]] = None):
  """The generated task or ``Rows`` of ``data.source=text`` with the ``data`` ``settings``
  (``data_settings``'s form; defaults when None)."""
  name, arg = parse_data_source(text)
  return DATA_SOURCES.get(name)(arg, data_settings(settings))


def fingerprint(text: str) -> Optional[str]:
  """sha256 of the files a source reads (None for a source built by code): a resumed run checks
  that its data did not change (``rljax.runs.run_dir``)."""
  name, arg = parse_data_source(text)
  files = DATA_SOURCES.meta(name)["files"]
  if files is None:
    return None
  digest = hashlib.sha256()
  for file in files(arg):
    digest.update(os.path.basename(file).encode() + b"\0")
    with open(file, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()

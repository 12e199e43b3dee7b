"""The configuration: every key declared once (``table``: default, allowed values, when it is
read, doc; the format in ``declare``), when keys are read (``conditions``), the constraints between
keys (``relations``), the reward-composition language (``reward_spec``), the start-up checks
(``checks``) and config files with ``--config.key=value`` overrides (``loader``).

``rljax.config()`` is ``load()``: the package's defaults, or a config file's ``get_config()``,
with overrides set and the result locked. Importing this package stays cheap (no JAX): the command
line reads a config before it sets XLA's flags.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Mapping

import ml_collections

from rljax.config import loader, table


def load(path: str | None = None, overrides: Mapping[str, Any] | None = None
         ) -> ml_collections.ConfigDict:
  """The default config of the installed package (every key of docs/config.md with its
  default), or the ``get_config()`` of a config file, with ``overrides`` ({"a.b": value}) set.
  Unknown keys and values of the wrong type are errors naming the key."""
  result = table.get_config() if path is None else loader.load_config_file(path)
  for dotted, value in (overrides or {}).items():
    loader.set_value(result, dotted, value)
  result.lock()
  return result


class _CallableModule(types.ModuleType):
  """``rljax.config(...)`` stays the one-call API of notebooks while ``rljax.config`` is also
  this package."""

  def __call__(self, path: str | None = None, overrides: Mapping[str, Any] | None = None
               ) -> ml_collections.ConfigDict:
    return load(path, overrides)


sys.modules[__name__].__class__ = _CallableModule

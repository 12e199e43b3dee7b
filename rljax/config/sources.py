"""Model sources: where a model's weights come from, parsed in one place.

Every key that names a model (``model.source`` for the policy, ``teacher.source`` for the
distillation teacher, the argument of ``rljax.load``) is one of:

- ``tiny``: a fresh random model of the config's 'tiny' sizes (tests, smoke runs);
- ``sft``: the supervised cold start in ``sft.out_dir`` (a Hugging Face directory, trained first
  when missing);
- ``hf:PATH``: a Hugging Face directory (config.json + safetensors);
- ``run:DIR`` or ``run:DIR@STEP``: an rljax run directory: the model of its checkpoint ``STEP``
  (default: the latest committed one), with the architecture of its ``config.json``, for every
  role (``rljax.loading``; docs/model_sources.md).

This module is the grammar only (it sits at the bottom, so any key's reader can parse); the
roles and the one loader are ``rljax.loading``. Anything outside the grammar is a one-line
``StartupError`` naming the key, the value and the forms allowed.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

import ml_collections

from rljax.errors import RunDirError, StartupError

KINDS = ("tiny", "sft", "hf", "run")
POLICY_SOURCES = KINDS  # model.source: the policy (and its reference) starts from any of them
_FORMS = {"tiny": "'tiny'", "sft": "'sft'", "hf": "'hf:PATH'", "run": "'run:DIR[@STEP]'"}


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """A parsed model source. ``path``: the Hugging Face directory (``hf``) or the run directory
  (``run``); ``step``: a run's checkpoint step (None: the latest); ``text``: as written."""
  kind: str
  path: Optional[str] = None
  step: Optional[int] = None
  text: str = ""


def forms(kinds: Sequence[str]) -> str:
  """'tiny', 'sft' or 'hf:PATH': the written forms of ``kinds``, for messages."""
  written = [_FORMS[k] for k in kinds]
  return written[0] if len(written) == 1 else f"{', '.join(written[:-1])} or {written[-1]}"


def parse_source(text: str, key: str = "model.source", kinds: Sequence[str] = KINDS,
                 bare_paths: bool = False) -> ModelSource:
  """``text`` as a ``ModelSource`` of one of ``kinds``.

  ``bare_paths``: a plain directory is accepted too (``rljax.load``): a run directory when it
  holds ``checkpoints/``, else a Hugging Face directory. Raises ``StartupError`` ("``key`` must
  be ..., got ...") for anything else; whether a path exists is the loader's to check.
  """
  unknown = [k for k in kinds if k not in KINDS]
  if unknown:
    raise ValueError(f"parse_source: unknown source kinds {unknown}; known: {KINDS}")
  source = _parse(text, bare_paths) if isinstance(text, str) else None
  if source is None or source.kind not in kinds:
    extra = " or a directory" if bare_paths else ""
    raise StartupError(f"{key} must be {forms(kinds)}{extra}, got {text!r}")
  return source


def _parse(text: str, bare_paths: bool) -> Optional[ModelSource]:
  if text in ("tiny", "sft"):
    return ModelSource(text, text=text)
  if text.startswith("hf:") and len(text) > 3:
    return ModelSource("hf", text[3:], text=text)
  if text.startswith("run:") and len(text) > 4:
    path, step = text[4:], None
    head, sep, tail = path.rpartition("@")
    if sep and head and tail.isdigit():
      path, step = head, int(tail)
    return ModelSource("run", path, step, text=text)
  if bare_paths and text and os.path.isdir(text):
    if os.path.isdir(os.path.join(text, "checkpoints")):
      return ModelSource("run", text, text=text)
    return ModelSource("hf", text, text=text)
  return None


def run_config(run_dir: str) -> ml_collections.ConfigDict:
  """The config of the rljax run in ``run_dir`` (its ``config.json``): the architecture, the
  tokenizer and the algorithm its checkpoints were written with."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path):
    raise RunDirError(f"{run_dir!r} is not an rljax run directory (no config.json)")
  try:
    with open(path) as f:
      return ml_collections.ConfigDict(json.load(f))
  except (OSError, ValueError) as e:
    raise RunDirError(f"{path} is not readable JSON ({e})") from None

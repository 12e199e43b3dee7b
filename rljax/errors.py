"""Errors that are the user's to fix (a bad config value, a run directory in use, a checkpoint
that cannot be read): the command line prints them as one line, ``error: <message>``, without a
traceback, and exits with ``USER_ERROR`` (2). Anything else is an internal error: Python's
traceback and exit status 1."""
from __future__ import annotations

import argparse
import errno
import logging
import sys

USER_ERROR = 2  # exit status of a user error (argparse uses 2 for bad arguments too)

# errno values that mean "the disk (or the process's file-size limit) has no room": the user frees
# space or moves the run, nothing in rljax is wrong.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# How tensorstore (under orbax) words the same errno in the ValueError it raises. Never
# "RESOURCE_EXHAUSTED" alone: XLA says that of device memory, which is no disk problem.
_NO_ROOM_TEXT = ("No space left on device", "Disk quota exceeded", "File too large")


class RljaxError(Exception):
  """A clear, one-line problem with the user's input or files (the message says what to do)."""


class ConfigKeyError(RljaxError, KeyError):
  """An override names a config key that does not exist."""

  def __str__(self):  # KeyError's would print the message's repr
    return str(self.args[0])


class ConfigTypeError(RljaxError, TypeError):
  """An override's value is not of the key's type."""


class UsageError(RljaxError):
  """The command line itself is malformed (a flag without its value, an unknown command)."""


class ArgumentParser(argparse.ArgumentParser):
  """``argparse`` whose mistakes (an unknown flag, a missing or malformed value) are a
  ``UsageError``: one line naming the command, exit status ``USER_ERROR``, as every other error of
  the command line, instead of argparse's usage block."""

  def error(self, message):
    raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


class StartupError(RljaxError, ValueError):
  """A config value a component refused while the run was being resolved (an unknown name, a
  combination the algorithm does not allow)."""


class ConfigError(RljaxError, ValueError):
  """A config value outside what the key allows, or keys that do not fit together (the message
  names the keys)."""


class UnusedKeyError(ConfigError):
  """A key differs from its default and nothing the config resolved to reads it."""


class DataError(RljaxError, ValueError):
  """A dataset file or line that cannot be read (the message names file and line)."""


class MissingPackageError(RljaxError, ImportError):
  """An optional package a config needs is not installed; the message names the extra."""


class DataFileNotFoundError(RljaxError, FileNotFoundError):
  """``data.source`` names a file or directory that does not exist."""


class ConfigFileError(RljaxError, FileNotFoundError):
  """``--config PATH`` does not exist or defines no ``get_config()``."""


class UnknownNameError(RljaxError, KeyError, ValueError):
  """A config names a component that is not registered (the message lists the registered ones).

  Also a ``KeyError`` (a failed lookup) and a ``ValueError`` (a bad config value), so callers
  may catch either.
  """

  def __str__(self):  # KeyError's would print the message's repr
    return str(self.args[0])


class UnknownComponentError(ConfigError, UnknownNameError):
  """A config key names no registered component (the message lists the registered names)."""


class RewardSourceError(RljaxError, ValueError):
  """A reward source returned what the composition cannot use (NaN, infinity, the wrong shape)."""


class ModelFileError(RljaxError, ValueError):
  """A Hugging Face model directory that cannot be used (missing, unreadable, unsupported)."""


class MissingTensorError(ModelFileError, KeyError):
  """A Hugging Face checkpoint lacks tensors the architecture needs (or has unknown ones)."""

  def __str__(self):
    return str(self.args[0])


class RunDirError(RljaxError, RuntimeError):
  """The run directory is in use, holds no run to resume, or holds a different run."""


class TokenizerError(RljaxError, ValueError):
  """``data.tokenizer`` cannot be loaded or lacks what the run needs (EOS, a chat template)."""


class DiskFullError(RljaxError, OSError):
  """A write failed because the disk (or the file-size limit) has no room."""


def _is_no_room(error: BaseException) -> bool:
  if isinstance(error, OSError) and error.errno in _NO_ROOM:
    return True
  return any(text in str(error) for text in _NO_ROOM_TEXT)


def _chain(error: BaseException):
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def _reason(error: BaseException) -> str:
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  return next(text for text in _NO_ROOM_TEXT if text in str(error))


def disk_full(error: BaseException) -> DiskFullError | None:
  """A ``DiskFullError`` when ``error`` or anything in its chain is a write that found no room
  (orbax and tensorstore wrap the ``OSError`` in their own types), else None."""
  for link in _chain(error):
    if _is_no_room(link):
      where = getattr(link, "filename", None)
      what = f"writing {where}" if where else "a write of the run"
      return DiskFullError(
          f"{what} failed: {_reason(link)} (the disk is full, or a quota or file-size limit was "
          "reached). Free space and continue with --config.train.resume=True (checkpoints that "
          "were not complete are never resumed from), or choose a train.run_dir on another disk")
  return None


class _QuietDiskFull:
  """A logging filter: orbax's and asyncio's background threads log a traceback each for one
  full disk (five over 460 lines); the main thread reports it once, as one line."""

  def filter(self, record) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and disk_full(error) is not None:
      return False
    return not any(text in record.getMessage() for text in _NO_ROOM_TEXT)


def _closed_loop(unraisable) -> bool:
  return (unraisable.exc_type is RuntimeError
          and str(unraisable.exc_value) == "Event loop is closed")


def quiet_disk_full_logs() -> None:
  """Filters the background noise of a failed orbax save (see ``_QuietDiskFull``); the error
  itself still reaches the main thread. Also drops the "Event loop is closed" errors tensorstore's
  callbacks raise, unraisable, into the event loop orbax closed after the failure."""
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if not any(isinstance(f, _QuietDiskFull) for f in logger.filters):
      logger.addFilter(_QuietDiskFull())
  previous = sys.unraisablehook
  if getattr(previous, "rljax_quiet", False):
    return

  def hook(unraisable):
    if not _closed_loop(unraisable):
      previous(unraisable)
  hook.rljax_quiet = True
  sys.unraisablehook = hook


def user_error(error: BaseException) -> RljaxError | None:
  """The user's error that ``error`` is (an ``RljaxError``, or a full disk), else None."""
  if isinstance(error, RljaxError):
    return error
  return disk_full(error)

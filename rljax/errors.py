"""Errors that are the user's to fix (a bad config value, a run directory in use, a checkpoint
that cannot be read): the command line prints them as one line, ``error: <message>``, without a
traceback."""


class RljaxError(Exception):
  """A clear, one-line problem with the user's input or files (the message says what to do)."""


class ConfigKeyError(RljaxError, KeyError):
  """An override names a config key that does not exist."""

  def __str__(self):  # KeyError's would print the message's repr
    return str(self.args[0])


class ConfigTypeError(RljaxError, TypeError):
  """An override's value is not of the key's type."""


class DataError(RljaxError, ValueError):
  """A dataset file or line that cannot be read (the message names file and line)."""


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

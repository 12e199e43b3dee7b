"""Errors that are the user's to fix (a bad config value, a run directory in use, a checkpoint
that cannot be read): the command line prints them as one line, ``error: <message>``, without a
traceback."""


class RljaxError(Exception):
  """A clear, one-line problem with the user's input or files (the message says what to do)."""

"""What an environment needs to run at all, checked at start-up before any model is built
(``loop.train`` and ``rljax eval``); the ``env`` keys themselves are checked with every other key
(``rljax.config.checks``)."""
import pickle

from rljax.envs import base, tools
from rljax.errors import ConfigError


def check_env_startup(config, tokenizer) -> None:
  """What the environment needs to run at all, checked before any model is built; raises
  ``ConfigError`` (one line naming the environment):

  - it can be constructed and travel to the worker processes and back (pickled: a class defined
    where the workers cannot import it, e.g. in the config file, cannot);
  - with hermes calls and a chat template (``rljax.envs.episodes.message_turns``), the template
    renders tool messages after an assistant message (Gemma 3's refuses a tool role).
  """
  if "env" not in config or config.env.name is None:
    return
  e = config.env
  try:
    env = base.make_env(e.name, max_turns=e.max_turns, tool_format=e.tool_format)
  except Exception as error:
    raise ConfigError(f"env.name={e.name!r} cannot be constructed: {type(error).__name__}: "
                      f"{_first_line(error)}") from None
  if not env.stepped:  # an agent harness: its workers look it up by name
    return
  try:
    pickle.loads(pickle.dumps(env))
  except Exception as error:
    raise ConfigError(
        f"env.name={e.name!r} cannot be sent to its worker processes ({type(error).__name__}: "
        f"{_first_line(error)}): define the class in an importable module, not in the config "
        "file or a notebook's __main__") from None
  if e.tool_format == "hermes" and tokenizer.chat_turns:
    try:
      tokenizer.render_followup(tools.tool_messages(["1"]))
    except Exception as error:
      raise ConfigError(f"env.tool_format='hermes' with data.chat_template=True: "
                        f"{_first_line(error)}") from None


def _first_line(error) -> str:
  lines = str(error).strip().splitlines()
  return lines[0][:300] if lines else ""

"""Start-up checks of the ``env`` section against the rest of the config (``loop.train`` and
``rljax eval`` run them before anything is built)."""
import pickle

from rljax.envs import base, tools

# reward.* keys that only single-turn scoring reads (the environment scores episodes; its steps
# run in the reward.workers processes, with their memory and recycling limits, under
# env.timeout_s).
# (reward.max_logged_failures bounds env_failures.jsonl as well.)
VERIFIER_ONLY_KEYS = ("fn", "format_weight", "wrong_value", "overlong_buffer", "timeout_s")


def check_env_config(config) -> None:
  """The constraints between ``env.*`` and the rest of the config; raises ``ConfigError``."""
  from rljax.algos.usage import UnusedKeyError
  from rljax.config_checks import ConfigError
  from rljax.defaults import KEY_BY_NAME
  _differs = lambda name, value: value != KEY_BY_NAME[name].default
  if "env" not in config:  # a config saved before the env section existed
    return
  e = config.env
  if e.name is None:
    for leaf in ("max_turns", "max_tokens", "timeout_s", "tool_format", "engine", "slots",
                 "turn_discount"):
      if _differs(f"env.{leaf}", e[leaf]):
        raise UnusedKeyError(f"env.{leaf}={e[leaf]!r} is not used: rollouts are single-turn "
                             "(env.name=None); set env.name to an environment or drop the key")
    return
  if e.engine != "continuous" and _differs("env.slots", e.slots):
    raise UnusedKeyError(f"env.slots={e.slots!r} is not used: only env.engine='continuous' "
                         f"decodes in lanes (env.engine={e.engine!r})")
  if e.turn_discount != 1.0:
    import rljax.algos  # noqa: F401  (registers every estimator)
    from rljax.algos.registry import ADVANTAGES
    if "token_rewards" not in ADVANTAGES.meta(config.algo.advantage)["inputs"]:
      raise UnusedKeyError(
          f"env.turn_discount={e.turn_discount!r} is not used: algo.advantage="
          f"{config.algo.advantage!r} reads one reward per episode; the token-level estimators "
          "read it (" + ", ".join(n for n in ADVANTAGES.names()
                                  if "token_rewards" in ADVANTAGES.meta(n)["inputs"]) + ")")
  for leaf in VERIFIER_ONLY_KEYS:
    if _differs(f"reward.{leaf}", config.reward[leaf]):
      raise UnusedKeyError(
          f"reward.{leaf}={config.reward[leaf]!r} is not used: env.name={e.name!r} scores the "
          "episodes (its steps run under env.timeout_s in the reward.workers processes)")
  if config.model.get("router_replay") == "R3":
    raise ConfigError("model.router_replay='R3' replays the experts the sampler chose for each "
                      f"token; multi-turn episodes (env.name={e.name!r}) do not record them: use "
                      "'R2' (the old-log-prob forward's experts) or 'off'")
  if e.tool_format == "hermes" and config.data.tokenizer == "char":
    raise ConfigError("env.tool_format='hermes' needs a tokenizer that can write "
                      "'<tool_call>{\"name\": ...}</tool_call>'; the char tokenizer has no braces, "
                      "quotes or '_': use env.tool_format='compact'")


def check_env_startup(config, tokenizer) -> None:
  """What the environment needs to run at all, checked before any model is built; raises
  ``ConfigError`` (one line naming the environment):

  - it can be constructed and travel to the worker processes and back (pickled: a class defined
    where the workers cannot import it, e.g. in the config file, cannot);
  - with hermes calls and a chat template (``rljax.envs.rollout.message_turns``), the template
    renders tool messages after an assistant message (Gemma 3's refuses a tool role).
  """
  # Imported here as check_env_config does: rljax.defaults imports this package (env.name's
  # check), and config_checks imports rljax.defaults.
  from rljax.config_checks import ConfigError
  if "env" not in config or config.env.name is None:
    return
  e = config.env
  try:
    env = base.make_env(e.name, max_turns=e.max_turns, tool_format=e.tool_format)
  except Exception as error:
    raise ConfigError(f"env.name={e.name!r} cannot be constructed: {type(error).__name__}: "
                      f"{_first_line(error)}") from None
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

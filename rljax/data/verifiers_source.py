"""Environments of the ``verifiers`` library as a prompt source: ``data.source='verifiers:ID'``.

``verifiers`` (``pip install 'rljax[verifiers]'``) packages an RL environment as a
``vf.Environment``: a dataset of rows (``prompt`` chat messages, ``answer``, ``info``, ...), a
``Rubric`` (weighted reward functions) and, for multi-turn environments, ``env_response``. ``ID``
names how to build one, as the library's own loader does:

- ``'verifiers:NAME'``: an installed environment module (``NAME`` or ``NAME`` with ``-`` as
  ``_``) whose ``load_environment(**args)`` returns the environment
  (``verifiers.load_environment``);
- ``'verifiers:MODULE:FUNCTION'``: ``FUNCTION(**args)`` of an importable module (a config's own
  environment: ``configs.verifiers_arith:load_environment``).

``args`` is ``data.verifiers.args``, a JSON object. The environment is built once per process
(cached by ``(ID, args)``); the trainer builds it before the environment workers fork, so they
inherit it. Here its dataset becomes rljax ``Problem``s: the train rows are the environment's
``dataset``; the held-out rows are its ``eval_dataset`` where it has one, else about a tenth of
the dataset's rows split off by a hash of the prompt (``is_eval_prompt``, as for file sources); the
eval set of ``data.eval_seed`` is a shuffle of the held-out rows. Each ``Problem`` carries its row
(``meta['verifiers']``), which the ``verifiers`` environment of ``rljax.envs.verifiers_env`` starts
its episode from. ``Problem.prompt`` is the row's messages' contents joined by newlines (what a
tokenizer without a chat template reads); ``answer`` the row's answer as text.
"""
from __future__ import annotations

import functools
import importlib
import json

from rljax.config import conditions
from rljax.data.sources import Rows, register_data_source
from rljax.data.tasks import Problem, is_eval_prompt
from rljax.errors import DataError, MissingPackageError

SOURCE_KIND = conditions.VERIFIERS
# The dataset columns an episode reads (``Environment.init_state``); the others stay behind.
ROW_FIELDS = ("prompt", "answer", "info", "task", "example_id")


def library():
  """The classic (v0) ``verifiers`` API: ``import verifiers as vf`` (a heavy optional
  dependency: openai, anthropic, datasets clients)."""
  try:
    import verifiers  # optional extra [verifiers]: imported only by verifiers sources
  except ImportError:
    raise MissingPackageError("data.source='verifiers:...' needs the verifiers library: "
                      "pip install 'rljax[verifiers]'") from None
  return verifiers


def parse_args(text: str) -> dict:
  """``data.verifiers.args``: a JSON object of the loader's keyword arguments."""
  try:
    args = json.loads(text)
  except json.JSONDecodeError as e:
    raise DataError(f"data.verifiers.args={text!r} is not JSON ({e.msg}); write an object like "
                    "'{\"num_train\": 200}'") from None
  if not isinstance(args, dict):
    raise DataError(f"data.verifiers.args={text!r} must be a JSON object of keyword arguments")
  return args


def _loader(env_id: str):
  """The function that builds ``env_id``'s environment (module docstring)."""
  vf = library()
  module_name, sep, function = env_id.partition(":")
  if not sep:
    return functools.partial(vf.load_environment, env_id)
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise DataError(f"data.source='verifiers:{env_id}': module {module_name!r} cannot be "
                    f"imported ({type(e).__name__}: {e})") from None
  fn = getattr(module, function, None)
  if not callable(fn):
    raise DataError(f"data.source='verifiers:{env_id}': module {module_name!r} has no function "
                    f"{function!r}")
  return fn


@functools.lru_cache(maxsize=None)
def environment(env_id: str, args_json: str = "{}"):
  """The ``vf.Environment`` of ``data.source='verifiers:<env_id>'`` built with ``args_json``
  (cached per process)."""
  vf = library()
  load = _loader(env_id)
  args = parse_args(args_json)
  try:
    env = load(**args)
  except DataError:
    raise
  except Exception as e:  # the library's loader wraps a missing module in a RuntimeError
    raise DataError(f"data.source='verifiers:{env_id}' with data.verifiers.args={args_json}: "
                    f"building the environment failed ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
  if not isinstance(env, vf.Environment):
    raise DataError(f"data.source='verifiers:{env_id}' built a {type(env).__name__}, not a "
                    "verifiers Environment (vf.SingleTurnEnv, vf.MultiTurnEnv, vf.ToolEnv, ...)")
  if not isinstance(env, vf.MultiTurnEnv):
    raise DataError(f"data.source='verifiers:{env_id}' built a {type(env).__name__}: rljax runs "
                    "the rollout loop of environments derived from vf.MultiTurnEnv "
                    "(vf.SingleTurnEnv, vf.ToolEnv, ...), and this one is not")
  if env.rubric.has_group_rewards:
    raise DataError(f"data.source='verifiers:{env_id}': its rubric has group-level reward "
                    "functions (arguments 'completions', 'states', ...), which score a group "
                    "together; rljax scores each episode alone: use per-rollout functions")
  return env


def message_text(content) -> str:
  """A message's content as text (content parts: their text parts, joined)."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  parts = []
  for part in content:
    text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
    if text is not None:
      parts.append(str(text))
  return "".join(parts)


def _content(message):
  return message_text(message.get("content") if isinstance(message, dict)
                      else getattr(message, "content", None))


def prompt_text(prompt) -> str:
  """The row's prompt as one text for a tokenizer without a chat template: the messages'
  contents joined by newlines (a text prompt as it is)."""
  if isinstance(prompt, str):
    return prompt
  return "\n".join(_content(m) for m in prompt)


def _plain_row(row: dict) -> dict:
  """The fields of a dataset row an episode reads, as JSON data."""
  out = {k: row[k] for k in ROW_FIELDS if k in row and row[k] is not None}
  return json.loads(json.dumps(out, default=str))


def _problem(row: dict, env_id: str, args_json: str, split: str, index: int,
             chat: bool) -> Problem:
  row = _plain_row(row)
  if "prompt" not in row:
    raise DataError(f"data.source='verifiers:{env_id}': {split} row {index} has no prompt")
  answer = row.get("answer", "")
  return Problem(prompt=prompt_text(row["prompt"]),
                 answer=answer if isinstance(answer, str) else json.dumps(answer),
                 meta={SOURCE_KIND: {"id": env_id, "args": args_json, "row": row, "chat": chat},
                       "source": f"verifiers:{env_id}", "row": index, "split": split})


def problems(env_id: str, args_json: str = "{}",
             chat: bool = False) -> tuple[list[Problem], list[Problem]]:
  """``(train problems, held-out problems)`` of the environment (module docstring); ``chat``:
  the run wraps prompts in a chat template (``data.chat_template``), so its episodes observe chat
  messages."""
  env = environment(env_id, args_json)
  rows = list(env.get_dataset()) if (env.dataset is not None or env.dataset_source) else []
  train = [_problem(r, env_id, args_json, "train", i, chat) for i, r in enumerate(rows)]
  if env.eval_dataset is not None or env.eval_dataset_source is not None:
    held = [_problem(r, env_id, args_json, "eval", i, chat)
            for i, r in enumerate(env.get_eval_dataset())]
  else:
    held = [p for p in train if is_eval_prompt(p.prompt)]
    train = [p for p in train if not is_eval_prompt(p.prompt)]
  if not train:
    raise DataError(f"data.source='verifiers:{env_id}' has no training rows")
  return train, held


@register_data_source(SOURCE_KIND, reads=(f"data.{SOURCE_KIND}.args",))
def verifiers_data_source(env_id: str, settings) -> Rows:
  """``data.source='verifiers:ID'``: the dataset of an environment of the ``verifiers`` library
  (an optional dependency, ``rljax[verifiers]``; ``data.verifiers.args``), run by
  ``env.name='verifiers'``; its held-out rows are the environment's eval dataset, or a hash
  split."""
  train, held = problems(env_id, settings[SOURCE_KIND]["args"], settings["chat_template"])
  return Rows(train, held_out=held)

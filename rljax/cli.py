"""``rljax <command>`` (also ``python -m rljax <command>``).

  train             --config configs/algos/dapo.py [--config.key=value ...]   RL training
  sft               --config configs/jobs/main.py                  supervised cold start
  rm                --config configs/tasks/rm.py --config.rm.train_file=PAIRS.jsonl   reward model
  eval              --config X [--samples K] [--checkpoint RUN_DIR | --config.model.source=hf:P]
  check-conversion  PATH                   rljax vs transformers logits on a HF directory
  convert           RUN_DIR OUT [--format peft|merged] [--force]   latest checkpoint of a run ->
                    a PEFT adapter (a LoRA run's default) or full Hugging Face weights (merged)
  plan              --config X [--device v5p-64|8xh100-80g|8x80GB]   memory plan on the mesh
  components [--markdown]                  the registered components, environments and tools;
                                           --markdown: the algorithm reference (docs/algorithms.md)
  keys              [--markdown] [PREFIX]  every config key: default, allowed values, doc
  sweep             STUDY [--parallel N] [--print-commands] [--aggregate-only]   an ablation study

rljax COMMAND --help: the command's options, and the config keys it reads.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

from rljax.config import loader as config_loader
from rljax import lifetime
from rljax.errors import USER_ERROR, ArgumentParser, UsageError

CONVERT_FORMATS = ("peft", "merged")  # rljax convert --format


# The commands that take a config file: what each does (the first line of its --help).
CONFIG_COMMANDS = {
    "train": "RL training of the config's run (its get_config(), overrides on top).",
    "sft": "The supervised cold start of model.source='sft' (sft.*), written to sft.out_dir.",
    "rm": "Reward-model training on preference pairs (rm.*; docs/reward_models.md).",
    "eval": "pass@1 (with --samples K also pass@k and maj@k) of model.source, or of the latest "
            "checkpoint of a run directory.",
    "plan": "The memory plan of the config's run on a device mesh.",
}


class _Help(Exception):
  """``rljax <command> --help``: its text, printed by ``main`` (exit status 0)."""


def _parser(command: str, usage: str = "") -> ArgumentParser:
  """The parser of a config command's own options; its ``--help`` (``command_help``) adds the
  config keys the command reads."""
  import argparse
  import textwrap
  return ArgumentParser(prog=f"rljax {command}",
                        description=textwrap.fill(CONFIG_COMMANDS[command], 100),
                        usage=f"rljax {command} --config PATH [--config.KEY=VALUE ...]{usage}",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=_keys_read(command))


def _keys_read(command: str) -> str:
  """The config keys ``rljax <command>`` reads, by section (``Key.commands``)."""
  import textwrap
  from rljax.config import declare, effects
  sections: dict = {}
  for key in effects.command_keys(command):
    leaf = key.name[len(key.section) + 1:] if key.section else key.name
    mark = "" if key.commands[command] is declare.ALWAYS else "*"
    sections.setdefault(key.section or "top level", []).append(leaf + mark)
  lines = [f"--config PATH: a config file defining get_config() (configs/); --config.KEY=VALUE "
           f"sets one of the keys rljax {command} reads (a key it does not read is refused); "
           "`rljax keys KEY` gives a key's default, allowed values and doc; * = read only under "
           "a condition it names.", "", f"config keys rljax {command} reads:"]
  lines = [textwrap.fill(line, 100) for line in lines]
  lines += [textwrap.fill(f"{section}: {', '.join(leaves)}", 100, initial_indent="  ",
                          subsequent_indent="      ") for section, leaves in sections.items()]
  return "\n".join(lines)


def _config(argv, command: str, parser: ArgumentParser):
  """The config of ``--config PATH`` with its ``--config.KEY=VALUE`` overrides, checked (values,
  unread keys, relations; an override of a key ``command`` does not read) before anything is
  built or written; and the other arguments. ``--help`` anywhere: the command's help."""
  path, overrides, rest = config_loader.split_config_args(argv)
  if "-h" in rest or "--help" in rest:
    raise _Help(parser.format_help())
  if path is None:
    raise UsageError("--config PATH is required (e.g. --config configs/algos/dapo.py; "
                     f"rljax {command} --help)")
  config = config_loader.load_config(path, overrides)
  from rljax.config import checks as config_checks
  # Every value, then an override of a key the command does not read, before anything is built.
  config_checks.check_config(config, command, [key for key, _ in overrides])
  return config, rest


def cmd_train(argv):
  config, rest = _config(argv, "train", _parser("train"))
  if rest:
    raise UsageError(f"unexpected arguments {rest}; train takes --config PATH and "
                     "--config.key=value overrides only")
  from rljax.parallel import mesh
  from rljax.train import loop
  count = mesh.start_cpu_devices(config)
  import jax  # after the split: the CPU backend starts with its devices
  if count and count > 1 and jax.default_backend() == "cpu":  # on a GPU the split goes unused
    print(f"rljax: the CPU split into {count} JAX devices, one per core (mesh.cpu_devices)",
          flush=True)
  result = loop.train(config)
  printable = {k: v for k, v in result.items() if k not in ("last", "state")}
  print(json.dumps(printable))
  return result


def cmd_sft(argv):
  config, rest = _config(argv, "sft", _parser("sft"))
  if rest:
    raise UsageError(f"unexpected arguments {rest}; sft takes --config PATH and "
                     "--config.key=value overrides only")
  from rljax.data import tokenizer as tokenizer_lib
  from rljax.train import sft
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  sft.check_cold_start(config, tokenizer)  # before anything is written
  path = sft.ensure_sft_checkpoint(config, tokenizer)
  print(path)
  return path


def cmd_rm(argv):
  config, rest = _config(argv, "rm", _parser("rm"))
  if rest:
    raise UsageError(f"unexpected arguments {rest}; rm takes --config PATH and "
                     "--config.key=value overrides only")
  from rljax.train import reward_training
  result = reward_training.train_reward_model(config)
  print(json.dumps(result))
  return result


def cmd_eval(argv):
  parser = _parser("eval", " [--samples K] [--checkpoint RUN_DIR]")
  parser.add_argument("--samples", type=int, default=1, help="k for pass@k and maj@k")
  parser.add_argument("--checkpoint", default=None,
                      help="an rljax run directory: its latest checkpoint is evaluated")
  config, rest = _config(argv, "eval", parser)
  args = parser.parse_args(rest)
  from rljax.config import checks as config_checks
  config_checks.check_eval_samples(args.samples)
  from rljax.train import evaluation
  _, overrides, _ = config_loader.split_config_args(argv)
  result = evaluation.evaluate_config(config, samples=args.samples, checkpoint=args.checkpoint,
                                      overridden=[key for key, _ in overrides])
  print(json.dumps(result))
  return result


def cmd_check_conversion(argv):
  parser = ArgumentParser(prog="rljax check-conversion")
  parser.add_argument("path", help="local Hugging Face model directory")
  args = parser.parse_args(argv)
  try:
    import torch  # noqa: F401
  except ImportError:
    raise UsageError("check-conversion compares against transformers running on PyTorch, which "
                     "is not installed: pip install 'rljax[hf]'") from None
  from rljax.models import check_conversion
  report = check_conversion(args.path)
  print(f"max abs logit diff: {report['max_abs_diff']:.3e}")
  print(f"mean KL(transformers || rljax) per token: {report['mean_kl']:.3e}")
  if report["nonfinite_logits"]:
    # A NaN compares false with every tolerance: printing it and exiting 0 passed broken weights.
    raise UsageError(f"check-conversion {args.path}: {report['nonfinite_logits']} logits are NaN "
                     "or infinite (rljax or transformers): the weights hold non-finite values; "
                     "re-export or re-download them")
  return report


def cmd_convert(argv):
  usage = "usage: rljax convert RUN_DIR OUT [--format peft|merged] [--force]"
  if any(arg.startswith("--config") for arg in argv):
    # Nothing a config sets changes the export: the weights and their architecture are the run's.
    raise UsageError("rljax convert takes no --config or --config.KEY overrides: the model is the "
                     f"run's (its config.json); {usage}")
  parser = ArgumentParser(prog="rljax convert")
  parser.add_argument("run_dir")
  parser.add_argument("out")
  parser.add_argument("--format", choices=CONVERT_FORMATS, default=None,
                      help="peft: the adapters of a LoRA run as a PEFT adapter (its default); "
                           "merged: full Hugging Face weights, adapters merged (any run's default)")
  parser.add_argument("--force", action="store_true",
                      help="write into OUT even if it holds files (they may be overwritten)")
  args = parser.parse_args(argv)
  from rljax.train import evaluation
  from rljax.runs import run_dir
  from rljax import models
  from rljax.models import peft
  from rljax.config import sources as source
  run_dir.check_convert_target(args.run_dir, args.out, force=args.force)
  config = source.run_config(args.run_dir)
  from rljax.loading import loader
  loader.check_run_kind(source.ModelSource("run", args.run_dir), "lm", f"convert {args.run_dir}")
  rank = config.model.get("lora", {}).get("rank", 0)
  form = args.format or ("peft" if rank else "merged")
  if form == "peft":
    if not rank:
      raise UsageError(f"convert --format peft: {args.run_dir!r} trained no adapters "
                       "(model.lora.rank=0); export its weights with --format merged")
    model_cfg, adapters = evaluation.load_run_params(args.run_dir, config, merged=False)
    base_source = source.parse_source(config.model.source)  # named in the adapter's config
    base = {"sft": config.sft.out_dir, "hf": base_source.path,
            "run": base_source.path and os.path.join(base_source.path, "hf")}.get(base_source.kind)
    base = base and os.path.abspath(base)
    _export_atomically(args.out, lambda path: peft.save_peft_adapter(path, model_cfg, adapters,
                                                                     base_model=base))
  else:
    model_cfg, params = evaluation.load_run_params(args.run_dir, config)
    _export_atomically(args.out, lambda path: models.save_hf(path, model_cfg, params))
  print(args.out)
  return args.out


def _export_atomically(out: str, write) -> None:
  """``write(path)`` into a new sibling directory ``OUT.partial-*``, then moved to ``out``
  (renamed onto a new or empty ``out``; file by file into one ``--force`` allows): an interrupted
  convert leaves no half-written model that reads as a whole one, and removes its staging
  directory (all but kill -9)."""
  staging = f"{os.path.abspath(out)}.partial-{os.getpid()}"
  shutil.rmtree(staging, ignore_errors=True)  # a killed convert's that had this pid
  try:
    os.makedirs(os.path.dirname(staging), exist_ok=True)
    os.mkdir(staging)  # the umask's mode, as OUT would have had
  except OSError as e:
    raise UsageError(f"convert: cannot write the output {out!r}: {e.strerror} ({e.filename}); "
                     "name a directory that can be created") from None
  try:
    write(staging)
    if not os.path.isdir(out) or not os.listdir(out):
      os.replace(staging, out)
    else:
      for name in os.listdir(staging):
        os.replace(os.path.join(staging, name), os.path.join(out, name))
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def cmd_plan(argv):
  parser = _parser("plan", " [--device NAME]")
  parser.add_argument("--device", default=None,
                      help="v5p-64 | 8xh100-80g | cpu | 8x80GB (default: the config's plan.device)")
  config, rest = _config(argv, "plan", parser)
  args = parser.parse_args(rest)
  from rljax import plan
  report = plan.plan_main(config, args.device)
  print(report)
  return report


def cmd_components(argv):
  parser = ArgumentParser(prog="rljax components")
  parser.add_argument("--markdown", action="store_true",
                      help="the algorithm reference, docs/algorithms.md")
  args = parser.parse_args(argv)
  from rljax import catalogue
  if args.markdown:
    text = catalogue.markdown()
    sys.stdout.write(text)
    return text
  table = catalogue.families()
  for family, names in table.items():
    print(f"{family}: {', '.join(names)}")
  return table


def cmd_keys(argv):
  parser = ArgumentParser(prog="rljax keys")
  parser.add_argument("prefix", nargs="?", default="", help="only keys starting with this")
  parser.add_argument("--markdown", action="store_true", help="the table of docs/config.md")
  args = parser.parse_args(argv)
  if args.markdown and args.prefix:
    raise UsageError(f"rljax keys --markdown prints the table of every key; drop {args.prefix!r} "
                     "(or drop --markdown to list the keys under it)")
  from rljax.config import checks as config_checks, relations, table, declare  # config_checks loads every registry
  if not any(name.startswith(args.prefix) for name in table.KEY_BY_NAME):
    sections = sorted({name.split(".")[0] for name in table.KEY_BY_NAME if "." in name})
    raise UsageError(f"rljax keys: no config key starts with {args.prefix!r}; sections: "
                     f"{', '.join(sections)}")
  text = (declare.markdown_table(table.KEYS, relations.RELATIONS) if args.markdown
          else declare.text_table(table.KEYS, args.prefix) + "\n")
  sys.stdout.write(text)
  return text


def cmd_sweep(argv):
  from rljax.sweep import sweep
  return sweep.main(argv)


COMMANDS = {
    "train": cmd_train, "sft": cmd_sft, "rm": cmd_rm, "eval": cmd_eval,
    "check-conversion": cmd_check_conversion, "convert": cmd_convert, "plan": cmd_plan,
    "components": cmd_components, "keys": cmd_keys, "sweep": cmd_sweep,
}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(__doc__)
    return None
  command, rest = argv[0], argv[1:]
  if command not in COMMANDS:
    raise UsageError(f"unknown command {command!r}; commands: {sorted(COMMANDS)}")
  try:
    return COMMANDS[command](rest)
  except _Help as shown:
    text = str(shown)
    sys.stdout.write(text)
    return text


class UserExit(SystemExit):
  """Exit status ``USER_ERROR``; ``str()`` is the line already printed (for tests)."""

  def __init__(self, message: str):
    super().__init__(USER_ERROR)
    self.message = message

  def __str__(self):
    return self.message


def _as_user_error(error: BaseException):
  from rljax import errors
  from rljax.algos.registry import UnknownNameError
  if isinstance(error, UnknownNameError):  # a config naming an unregistered component
    return error
  return errors.user_error(error)


def _stop_on_sigterm_outside_training():
  """Outside a training block (which installs its own handler: rljax.runs.preemption), SIGTERM
  ends the command with one line and 143 instead of a silent kill: the start-up's imports and
  checks take seconds, and a scheduler's SIGTERM there left the user nothing to read. Returns
  the handler it replaced (None off the main thread, where handlers cannot be installed)."""
  import signal
  import threading
  from rljax.runs.preemption import Stop

  def _stop(signum, frame):
    # Exits here rather than raising: an exception raised in a handler is swallowed when the
    # signal lands inside a garbage-collector callback (JAX installs one), and the run went on.
    stop = Stop("stopped (SIGTERM) outside the training loop (start-up or shutdown): no step "
                "was in flight", 128 + signum)
    sys.stdout.flush()
    print(stop.line, file=sys.stderr, flush=True)
    os._exit(stop.code)

  if threading.current_thread() is not threading.main_thread():
    return None
  return signal.signal(signal.SIGTERM, _stop)


def entry(argv=None):
  """The console entry point: ``main``, with the user's errors (``RljaxError``, a full disk) as
  one line on stderr and exit status 2, a preemption (SIGTERM) and Ctrl-C (SIGINT) as one line
  each; internal errors keep their traceback (exit status 1)."""
  from rljax import errors
  import signal
  from rljax.runs.preemption import Stop
  lifetime.die_with_parent()  # a run started by a sweep ends with it (kill -9 included)
  errors.quiet_disk_full_logs()
  previous = _stop_on_sigterm_outside_training()
  try:
    return main(argv)
  except Stop as stop:
    print(stop.line, file=sys.stderr, flush=True)
    raise SystemExit(stop.code) from None
  except KeyboardInterrupt:  # outside a training loop (start-up, other commands)
    print("interrupted (SIGINT)", file=sys.stderr, flush=True)
    raise SystemExit(130) from None
  except Exception as e:
    user = _as_user_error(e)
    if user is None:
      raise
    line = f"error: {' '.join(str(user).split())}"  # one line, whatever the message held
    print(line, file=sys.stderr)
    raise UserExit(line) from None
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
  entry()

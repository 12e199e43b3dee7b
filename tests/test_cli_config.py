"""The command line's config handling (in-process, no model built): every subcommand answers
``--help`` (its usage and the config keys it reads), two ``--config`` files are refused, and an
override of a key the command does not read (``Key.commands``) is refused before anything is
written."""
import json
import os

import jax
import pytest

import rljax
from rljax import cli, models
from rljax.config import effects
from rljax.models import transformer
from tests.train import tiny

GRPO = os.path.join(tiny.ROOT, "configs", "algos", "grpo.py")
RM = os.path.join(tiny.ROOT, "configs", "tasks", "rm.py")


def _exit_code(argv, capsys) -> tuple[int, str, str]:
  """(exit status, stdout, stderr) of ``rljax ARGV`` run as the console entry runs it."""
  try:
    cli.entry(argv)
    code = 0
  except SystemExit as e:
    code = e.code or 0
  out = capsys.readouterr()
  return code, out.out, out.err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_subcommand_answers_help(command, capsys):
  """Was: `rljax train --help` (and sft, rm, eval, plan) 'error: --config PATH is required',
  exit 2."""
  code, out, err = _exit_code([command, "--help"], capsys)
  assert code == 0 and not err
  assert out.startswith(f"usage: rljax {command}")
  if command in cli.CONFIG_COMMANDS:
    assert f"config keys rljax {command} reads:" in out


def test_help_lists_the_keys_the_command_reads(capsys):
  text = cli.main(["sft", "--help"])
  listed = {line.split(":")[0].strip() for line in text.splitlines() if line.startswith("  ")}
  assert {"model", "data", "sft", "rollout"} <= listed and not {"algo", "optim", "rm"} & listed
  assert "max_new_tokens" in text and "lora" not in text  # the cold start puts no adapters on
  train = cli.main(["train", "--config", GRPO, "--help"])  # --help with a config: the help
  assert "lora.rank" in train and "steps*" in train  # rm.steps: read with reward.gold.pairs > 0
  assert len(effects.command_keys("train")) > len(effects.command_keys("sft"))


def test_two_config_files_are_refused_in_one_line(tmp_path, capsys):
  """Was: the second --config silently replaced the first."""
  code, _, err = _exit_code(["train", "--config", GRPO, "--config", RM,
                             f"--config.train.run_dir={tmp_path / 'run'}"], capsys)
  assert code == 2 and err.count("\n") == 1
  assert f"--config given twice ({GRPO!r}, then {RM!r})" in err
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("command,config,override,message", [
    # Was: accepted, and the cold start trained every weight (SFT puts no adapters on).
    ("sft", GRPO, "model.lora.rank=4", "rljax sft does not read model.lora.rank; it is read by "
     "train, eval, plan, rm"),
    ("sft", GRPO, "optim.lr=0.1", "rljax sft does not read optim.lr"),  # SFT's is sft.lr
    # Was: accepted, and nothing read it (the policy is not the cold start).
    ("train", GRPO, "sft.steps=10", "rljax train reads sft.steps only with model.source or "
     "teacher.source 'sft': no model of the run is the SFT cold start"),
    ("train", GRPO, "rm.steps=10", "rljax train reads rm.steps only with reward.gold.pairs > 0"),
    ("rm", RM, "algo.kl_coef=0.1", "rljax rm does not read algo.kl_coef"),
])
def test_an_override_the_command_does_not_read_is_refused_before_anything_is_written(
    command, config, override, message, tmp_path, capsys):
  run = tmp_path / "run"
  argv = [command, "--config", config, f"--config.{override}", f"--config.sft.out_dir={run}"
          if command == "sft" else f"--config.train.run_dir={run}"]
  code, _, err = _exit_code(argv, capsys)
  assert code == 2 and err.count("\n") == 1
  assert f"error: --config.{override.split('=')[0]}: {message}" in err
  assert not os.path.exists(run)


def test_a_config_files_values_are_not_refused_for_a_command_that_does_not_read_them(tmp_path):
  """One file serves several commands: a job's sft.* keys (for rljax sft) and its algorithm
  (for rljax train) are not refused by the other command; only the command line is held to it."""
  config, _ = cli._config(["--config", os.path.join(tiny.ROOT, "configs", "jobs", "main.py"),
                           "--config.model.source=tiny"], "train", cli._parser("train"))
  assert config.sft.steps == 600
  config, _ = cli._config(["--config", GRPO, "--config.model.source=sft",
                           "--config.sft.steps=3", "--config.sft.warmup_steps=1"], "train",
                          cli._parser("train"))
  assert config.sft.steps == 3


JUDGE = {"reward.sources": "verifier:1,judge:1"}


@pytest.mark.parametrize("overrides,message", [
    ({**JUDGE, "reward.judge.source": "hf:/nowhere"},
     "reward.judge.source='hf:/nowhere': '/nowhere' is not a directory"),
    ({**JUDGE, "reward.judge.max_new_tokens": "100000000"},
     "reward.judge.max_new_tokens=100000000 leaves no room for a prompt in the judge's context"),
    # Was: a ValueError traceback at the first rollout.
    ({"rollout.engine": "continuous", "rollout.kv_cache_bytes": "1"},
     "rollout.kv_cache_bytes=1 holds no row: one row's cache of 16 slots takes 2048 bytes"),
    # Was: 'RuntimeError: cuDNN is not detected.' at the first forward (on a CPU).
    ({"model.attention": "cudnn"}, "model.attention='cudnn' needs a GPU; this process runs JAX "
     "on cpu: use 'auto' (blockwise here)"),
    # Was: a warning, then a run that trained without its tracker.
    ({"train.loggers": "('jsonl', 'mlflow')", "train.mlflow_tracking_uri": "foo://bar"},
     "train.mlflow_tracking_uri='foo://bar': MLflow refuses this store"),
    # Was: splash attention interpreted on the CPU, hundreds of times slower, without a word.
    ({"model.attention": "pallas"}, "model.attention='pallas' needs a TPU; this process runs JAX "
     "on cpu"),
])
def test_start_up_mistakes_are_refused_before_the_run_dir_is_written(overrides, message,
                                                                      tmp_path, capsys):
  """Was: the run dir (config.json, data.json, checkpoints/, metrics.jsonl) was written, then the
  mistake found when the reward, the engine or the first forward was built."""
  kernel = overrides.get("model.attention")
  if kernel in ("cudnn", "pallas") and jax.default_backend() == {"cudnn": "gpu"}.get(kernel, "tpu"):
    pytest.skip(f"{kernel} runs here")
  run = tmp_path / "run"
  code, _, err = _exit_code(tiny.args("grpo", str(run), overrides), capsys)
  assert code == 2 and err.count("\n") == 1 and message in err
  assert not os.path.exists(run)


def test_a_reward_models_tokenizer_is_checked_before_the_run_dir(tmp_path, capsys):
  """Was: the run dir written, then 'data.tokenizer=... is neither...' (a key the user had not
  set) when the reward was built."""
  rm = str(tmp_path / "rm")
  cfg = models.tiny_config(rljax.config(overrides={"model.hidden_size": 32,
                                                   "model.intermediate_size": 64,
                                                   "model.num_layers": 1}).model, 97,
                           eos_token_id=1, pad_token_id=0).base
  params = {k: v for k, v in transformer.init_params(cfg).items() if k != "lm_head"}
  params["score"] = transformer.init_params(cfg.replace(num_layers=0, vocab_size=1),
                                            head="score")["score"]
  models.save_hf(rm, cfg, params)  # a reward model without tokenizer files
  run = tmp_path / "run"
  argv = tiny.args("grpo", str(run), {"reward.sources": "verifier:1,rm:1",
                                      "reward.model.source": f"hf:{rm}",
                                      "reward.model.tokenizer": "/nowhere"})
  code, _, err = _exit_code(argv, capsys)
  assert code == 2 and err == ("error: reward.model.tokenizer='/nowhere' is neither 'char' nor an "
                               "existing local directory\n")
  assert not os.path.exists(run)


def test_the_rlhf_reward_models_pairs_file_is_checked_before_the_run_dir(tmp_path, capsys):
  """Was: config.json and data.json written, then a NotADirectoryError traceback when the gold
  scorer wrote its pairs (reward.gold.pairs > 0, the RLHF demo's cold start)."""
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  run = tmp_path / "run"
  argv = (["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "rlhf.py")]
          + [f"--config.{k}={v}" for k, v in {
              "model.source": "tiny", "mesh.cpu_devices": "0", "train.run_dir": str(run),
              "rm.train_file": str(blocker / "pairs.jsonl"),
              "reward.model.source": f"run:{tmp_path / 'rm'}"}.items()])
  code, _, err = _exit_code(argv, capsys)
  assert code == 2 and err.count("\n") == 1
  assert f"rm.train_file='{blocker}/pairs.jsonl' cannot be created: '{blocker}' is not a " \
         "directory" in err
  assert not os.path.exists(run) and not os.path.exists(tmp_path / "rm")


def test_rljax_rm_on_the_sft_cold_start_reads_what_the_cold_start_reads():
  """`rljax rm` with model.source='sft' trains the cold start first: it reads its data keys."""
  assert effects.read_by("rm", "data.source", {"model.source": "sft", "teacher.source": ""})
  assert not effects.read_by("rm", "data.source", {"model.source": "tiny", "teacher.source": ""})
  assert effects.read_by("rm", "rm.steps") and not effects.read_by("rm", "algo.kl_coef")


def _reward_model_run(path) -> str:
  """A directory as `rljax rm` starts it: its config.json and a data.json naming its pairs."""
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(rljax.config().to_json_best_effort())
  with open(os.path.join(path, "data.json"), "w") as f:
    json.dump({"source": "embedded:arithmetic", "sha256": None,
               "files": {"rm.train_file": {"path": "pairs.jsonl", "sha256": "0" * 64}}}, f)
  return str(path)


@pytest.mark.parametrize("use", ["train", "eval", "convert"])
def test_a_reward_model_run_where_a_policy_is_read_is_one_line(use, tmp_path, capsys):
  """Was: a 30-40 line traceback restoring its checkpoint (for `rljax train`, after the new run's
  directory was written)."""
  rm = _reward_model_run(tmp_path / "rm")
  run = tmp_path / "run"
  argv = {"train": tiny.args("grpo", str(run), {"model.source": f"run:{rm}"}),
          "eval": ["eval", "--config", GRPO, "--checkpoint", rm],
          "convert": ["convert", rm, str(tmp_path / "out")]}[use]
  code, _, err = _exit_code(argv, capsys)
  assert code == 2 and err.count("\n") == 1
  assert f"{rm!r} is an `rljax rm` run (a reward model, no language model head)" in err
  assert not os.path.exists(run) and not os.path.exists(tmp_path / "out")

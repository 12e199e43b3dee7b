"""``rljax rm`` under real use: SIGTERM saves the step and the run resumes to the uninterrupted
run's numbers; a resume on edited pairs, adapters, pairs that teach nothing, rows padded to
``rm.max_tokens`` and the ``hf:`` start of ``configs/tasks/rm.py``; the RLHF demo's reward-model cold
start killed (-9) or preempted, then rerun and resumed."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.data import preferences
from rljax.data.tokenizer import CharTokenizer
from rljax.errors import DataError, RunDirError, StartupError
from rljax.runs import metrics as metrics_lib
from rljax.runs import run_dir as run_dir_lib
from rljax.config.table import KEY_BY_NAME
from rljax.train import reward_training, rlhf
from tests import hf_models
from tests.train import tiny
from tests.train.test_reward_training import RM_ARGS, rule_pairs, write_jsonl

RM_CONFIG = os.path.join(tiny.ROOT, "configs", "tasks", "rm.py")
# Six steps, no periodic checkpoint (train.checkpoint_every's default 0): a preemption's save is
# the only one before the end.
ARGS = dict(RM_ARGS, **{"rm.steps": "6", "rm.eval_every": "3", "rm.batch_size": "8",
                        "train.checkpoint_every": "0"})


def rm_args(pairs: str, run_dir: str, **extra) -> list[str]:
  args = dict(ARGS, **{"rm.train_file": pairs, "train.run_dir": run_dir}, **extra)
  return ["rm", "--config", RM_CONFIG] + [f"--config.{k}={v}" for k, v in args.items()]


def _launch(point: str, args: list[str], cache: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=tiny.ROOT, JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return subprocess.run([sys.executable, "-m", "tests.reliability.killable", point] + args,
                        cwd=tiny.ROOT, env=env, capture_output=True, text=True, timeout=600,
                        start_new_session=True)


def _records(run_dir: str) -> list[dict]:
  rows = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return [metrics_lib.without_timing(r) for r in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The pairs and one uninterrupted run (in this process)."""
  root = tmp_path_factory.mktemp("rm_runs")
  pairs = write_jsonl(root / "pairs.jsonl", rule_pairs(120, seed=0))
  run_dir = str(root / "reference")
  result = cli.main(rm_args(pairs, run_dir))
  return root, pairs, run_dir, result


@pytest.mark.slow
def test_sigterm_saves_the_step_in_one_line_and_the_resume_ends_as_the_uninterrupted_run(
    reference):
  """Was: exit 143, no line, nothing saved (checkpoint_every=0 keeps nothing until the end)."""
  root, pairs, ref_dir, _ = reference
  run_dir = str(root / "preempted")
  result = _launch("term:rm:3", rm_args(pairs, run_dir), str(root / "jax_cache"))
  checkpoints = os.path.join(run_dir, "checkpoints")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"preempted (SIGTERM) at step 3: checkpoint saved in {checkpoints}; resume with "
      "--config.train.resume=True")
  assert run_dir_lib.committed_steps(run_dir) == [3]
  assert os.listdir(os.path.join(run_dir, "exports")) == ["3"]  # as every checkpoint has
  assert not os.path.exists(os.path.join(run_dir, run_dir_lib.LOCK_FILE))
  cli.main(rm_args(pairs, run_dir, **{"train.resume": "true"}))
  want, got = _records(ref_dir), _records(run_dir)
  assert [r["step"] for r in got] == [r["step"] for r in want] == [0, 1, 2, 3, 4, 5, 6]
  for a, b in zip(want, got):
    assert a.keys() == b.keys()
    for key in a:
      assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-6), (a["step"], key)


def test_a_resume_on_edited_pairs_is_refused_naming_the_file(reference, tmp_path):
  """Was: accepted (preferences reversed, accuracy 1.0 -> 0.33). ``data.json`` records the
  pairs' sha256 as it records a data file's."""
  _, pairs, ref_dir, _ = reference
  run_dir, edited = str(tmp_path / "run"), str(tmp_path / "pairs.jsonl")
  shutil.copytree(ref_dir, run_dir)
  rows = [json.loads(line) for line in open(pairs)]
  write_jsonl(edited, rows)
  # The run as if it had been made on `edited` (the same pairs so far): its files name it.
  record = json.load(open(os.path.join(run_dir, run_dir_lib.DATA_FILE)))
  assert record["files"]["rm.train_file"] == {"path": pairs,
                                              "sha256": run_dir_lib.file_sha256(edited)}
  record["files"]["rm.train_file"]["path"] = edited
  json.dump(record, open(os.path.join(run_dir, run_dir_lib.DATA_FILE), "w"))
  saved = json.load(open(os.path.join(run_dir, run_dir_lib.CONFIG_FILE)))
  saved["rm"]["train_file"] = edited
  json.dump(saved, open(os.path.join(run_dir, run_dir_lib.CONFIG_FILE), "w"))
  write_jsonl(edited, [dict(r, chosen=r["rejected"], rejected=r["chosen"]) for r in rows])
  args = rm_args(edited, run_dir, **{"train.resume": "true", "rm.steps": "8"})
  with pytest.raises(RunDirError, match=re.escape(
      f"cannot resume {run_dir}: the file of rm.train_file changed ({edited!r}, sha256 "
      f"{run_dir_lib.file_sha256(pairs)[:12]}...; now {edited!r}, sha256 "
      f"{run_dir_lib.file_sha256(edited)[:12]}...). Resume with the original file, or continue "
      "on this one with --config.train.resume_override=\"('rm.train_file',)\"")):
    cli.main(args)
  assert run_dir_lib.committed_steps(run_dir) == [6]


def test_adapters_are_refused_before_the_run_dir(reference, tmp_path, capsys):
  """Was: trained all steps, then a KeyError at the export and no hf/. rljax rm trains and
  exports every weight of a *ForSequenceClassification."""
  _, pairs, _, _ = reference
  run_dir = tmp_path / "lora"
  with pytest.raises(SystemExit) as e:
    cli.entry(rm_args(pairs, str(run_dir), **{"model.lora.rank": "4"}))
  assert e.value.code == 2
  assert capsys.readouterr().err == (
      "error: rljax rm trains every weight of the reward model and exports it as a whole "
      "*ForSequenceClassification; model.lora.rank=4 (low-rank adapters) is not supported for "
      "reward models: set model.lora.rank=0\n")
  assert not run_dir.exists()


def test_pairs_whose_chosen_is_the_rejected_are_refused_or_dropped_and_counted(tmp_path, capsys):
  """Was: trained to held-out accuracy 0.000 without a word (their margin is 0 whatever the
  model, and 0 counts as wrong)."""
  rows = rule_pairs(20, seed=3)
  rows[4] = dict(rows[4], rejected=rows[4]["chosen"])
  rows[9] = dict(rows[9], rejected=rows[9]["chosen"])
  pairs = write_jsonl(tmp_path / "same.jsonl", rows)
  with pytest.raises(SystemExit):
    cli.entry(rm_args(pairs, str(tmp_path / "run")))
  assert capsys.readouterr().err == (
      f"error: {pairs}:5: chosen and rejected are the same text, so the pair teaches nothing "
      "(its margin is 0 whatever the model) (1 more such pairs); fix the row, or set "
      "data.invalid_rows='drop' to leave such pairs out (counted)\n")
  assert not (tmp_path / "run").exists()
  config = config_loader.load_config(RM_CONFIG, [("rm.train_file", pairs),
                                                 ("data.invalid_rows", "drop")])
  lines = []
  train, held, dropped = reward_training.read_pairs(config, log=lines.append)
  assert dropped == 2 and len(train) + len(held) == 18
  assert all(p.chosen != p.rejected for p in train + held)
  assert lines == [f"data.invalid_rows='drop': left out 2 of 20 pairs whose chosen and rejected "
                   f"are the same text; first: {pairs}:5"]


def test_rows_are_padded_to_the_batch_and_bound_by_the_context(tmp_path):
  """Was: every row padded to rm.max_tokens (100000: a hang). Each batch is padded to its longest
  row's power of two; a row longer than the model's context (the tiny model's 4096) is refused
  naming it."""
  tok = CharTokenizer()
  pairs = [preferences.Pair("1+1=", "2" * n, "3", where=f"f:{n}") for n in (3, 9, 30)]
  rows = reward_training.PairRows(reward_training.encode_ids(tok, pairs, 100000, "x"), 100000,
                                  tok.pad_id)
  tokens, mask = rows.rows([0, 1])
  # BOS, 4 prompt characters, the response, EOS: chosen rows 9 and 15 long, rejected ones 7.
  assert tokens.shape == (4, 16) and mask.sum(axis=1).tolist() == [9, 15, 7, 7]
  assert rows.rows([2, 0])[0].shape == (4, 64)
  assert reward_training.PairRows(rows.encoded, 40, tok.pad_id).rows([2])[0].shape == (2, 40)
  long = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "1+1=", "chosen": "2" * 5000,
                                                "rejected": "3"}] * 4)
  config = config_loader.load_config(RM_CONFIG, [("rm.train_file", long),
                                                 ("rm.max_tokens", "100000")])
  limit, bound = reward_training.row_limit(config, tok)
  assert limit == 4096
  with pytest.raises(DataError, match=re.escape(
      f"{long}:1: the chosen row is 5006 tokens, more than the model's context of 4096 positions "
      "(max_position_embeddings; rm.max_tokens=100000)")):
    reward_training.encode_ids(tok, preferences.read_pairs(long), limit, bound)


def test_the_preset_starts_from_a_causal_lm_as_its_docstring_says(tmp_path):
  """Was: configs/tasks/rm.py set the tiny sizes, so its `hf:` start was refused ('model.hidden_size=64
  is not used'). Trained two steps with rm.max_tokens=100000 (rows padded to the batch)."""
  hf = hf_models.build("llama", str(tmp_path / "llama"))
  pairs = write_jsonl(tmp_path / "pairs.jsonl", rule_pairs(40, seed=1))
  args = {"model.source": f"hf:{hf}", "rm.train_file": pairs, "rm.steps": "2",
          "rm.batch_size": "4", "rm.max_tokens": "100000", "train.progress": "false",
          "train.run_dir": str(tmp_path / "run")}
  result = cli.main(["rm", "--config", RM_CONFIG] + [f"--config.{k}={v}" for k, v in args.items()])
  assert json.load(open(os.path.join(result["hf"], "config.json")))["architectures"] == [
      "LlamaForSequenceClassification"]
  assert 0.0 <= result["eval_accuracy"] <= 1.0


def _rlhf_args(root, **extra) -> list[str]:
  """The RLHF demo at the tiny size: a 2-step SFT cold start, 48 gold pairs, 6 reward-model
  steps with a checkpoint each (as the issue's probe: checkpoints on), one RL step."""
  args = dict(tiny.OVERRIDES, **{
      "sft.steps": "2", "sft.batch_size": "8", "sft.warmup_steps": "1",
      "sft.out_dir": str(root / "sft"), "reward.gold.pairs": "48", "rm.steps": "6",
      "rm.batch_size": "4", "rm.eval_every": "0", "rm.train_file": str(root / "pairs.jsonl"),
      "reward.model.source": f"run:{root / 'rm'}", "train.checkpoint_every": "1",
      "train.run_dir": str(root / "grpo"), "train.steps": "1", "rollout.max_new_tokens": "24"},
      **extra)
  return (["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "rlhf.py")]
          + [f"--config.{k}={v}" for k, v in args.items()])


@pytest.mark.slow
def test_the_rlhf_reward_model_cold_start_killed_then_rerun_and_resumed(tmp_path):
  """Was: after kill -9 during the reward model's training (checkpoints on) every rerun, the
  suggested train.resume=True included, failed with 'already holds checkpoints'. Now: kill -9,
  then a plain rerun continues the cold start (and is preempted by SIGTERM: the nested block's
  one line), then train.resume=True finishes the cold start and the run."""
  cache = str(tmp_path / "jax_cache")
  rm_dir = tmp_path / "rm"
  killed = _launch("rm:4", _rlhf_args(tmp_path), cache)
  assert "KILLED rm:4" in killed.stderr, killed.stderr[-3000:]
  steps = run_dir_lib.committed_steps(str(rm_dir))
  assert steps and not (rm_dir / "hf").exists()  # the state the reruns were refused on
  rerun = _launch("term:rm:1", _rlhf_args(tmp_path), cache)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "Traceback" not in rerun.stderr
  step = steps[-1] + 1
  assert rerun.stderr.strip().splitlines()[-1] == (
      f"preempted (SIGTERM) in the reward model's cold start at step {step}: checkpoint saved "
      f"in {rm_dir / 'checkpoints'}; resume with --config.train.resume=True")
  result = cli.main(_rlhf_args(tmp_path, **{"train.resume": "true"}))
  assert "eval_after" in result
  records = metrics_lib.read_jsonl(str(rm_dir / "metrics.jsonl"))
  assert [r["step"] for r in records] == list(range(7))  # no step twice, none missing
  assert (rm_dir / "hf" / "config.json").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("key, value, line", [
    ("rm.train_file", "/proc/rljax-pairs.jsonl",
     "rm.train_file='/proc/rljax-pairs.jsonl' cannot be created: '/proc' cannot be written ("),
    ("rm.train_file", "{root}",
     "rm.train_file='{root}' exists and is not a file; choose another rm.train_file"),
    ("reward.model.source", "run:/proc/rljax-rm",
     "reward.model.source='run:/proc/rljax-rm' cannot be created: '/proc' cannot be written ("),
], ids=["pairs_unwritable", "pairs_a_directory", "rm_dir_unwritable"])
def test_the_rlhf_cold_start_refuses_where_it_cannot_write_before_the_run_dir(
    key, value, line, tmp_path, capsys):
  """Was: the run dir claimed, then a FileNotFoundError / IsADirectoryError traceback where the
  pairs or the reward model were first written (after the SFT cold start for the latter)."""
  value, line = value.format(root=tmp_path), line.format(root=tmp_path)
  with pytest.raises(SystemExit) as e:
    cli.entry(_rlhf_args(tmp_path) + [f"--config.{key}={value}"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(f"error: {line}") and err.count("\n") == 1, err
  assert not (tmp_path / "grpo").exists() and not (tmp_path / "sft").exists()


def test_the_rlhf_cold_start_of_a_lora_policy_trains_a_whole_reward_model(tmp_path):
  """Was: a LoRA policy's RLHF run (``model.lora.rank=4``) claimed its run dir, wrote the pairs,
  then stopped at the reward model's cold start telling the user to set model.lora.rank=0 (the
  policy's adapters, not the reward model's). The cold start's config has the adapters off, the
  rest of the model as the run's."""
  args = _rlhf_args(tmp_path) + ["--config.model.lora.rank=4", "--config.model.lora.alpha=8"]
  config = config_loader.load_config(args[2], [tuple(a[len("--config."):].split("=", 1))
                                               for a in args[3:]])
  rm = rlhf.rm_config(config, str(tmp_path / "rm"))
  reward_training.check_start(rm)  # refused before
  assert rm.model.lora.to_dict() == {k: KEY_BY_NAME[f"model.lora.{k}"].default
                                     for k in rm.model.lora}
  assert rm.model.hidden_size == config.model.hidden_size == 32
  assert (config.model.lora.rank, config.model.lora.alpha) == (4, 8)  # the run's config as it was

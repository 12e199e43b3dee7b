"""The command line: config overrides, components, check-conversion, eval and convert."""
import json
import os

import jax
import numpy as np
import pytest

from rljax import cli, registries
from rljax.config import loader as config_loader
from rljax.errors import UsageError
from rljax.models import transformer
from tests import hf_models, xla_cache
from tests.train import tiny

BASE = os.path.join(tiny.ROOT, "configs", "base.py")


def test_override_types_and_unknown_keys():
  config = config_loader.load_config(BASE, [("algo.clip_eps_high", "0.28"),
                                            ("algo.dual_clip_c", "3"),
                                            ("algo.keep_pass_rate", "(0.1, 0.9)"),
                                            ("train.progress", "false")])
  assert config.algo.clip_eps_high == 0.28 and config.algo.dual_clip_c == 3.0
  assert config.algo.keep_pass_rate == (0.1, 0.9) and config.train.progress is False
  with pytest.raises(KeyError, match=r"algo\.clip_eps_hgh.*clip_eps_high"):
    config_loader.load_config(BASE, [("algo.clip_eps_hgh", "0.3")])
  with pytest.raises(TypeError, match=r"rollout\.group_size"):
    config_loader.load_config(BASE, [("rollout.group_size", "eight")])
  with pytest.raises(AttributeError, match="locked"):  # code cannot add keys either
    config_loader.load_config(BASE).algo.new_key = 1


def test_components_lists_every_family(capsys):
  table = cli.main(["components"])
  assert set(table) == set(registries.FAMILIES)
  out = capsys.readouterr().out
  # Tests may have registered more environments by now: the embedded ones must be listed.
  assert "cispo" in out and {"guess", "tool_calc"} <= set(table["environment"])
  assert "calc" in table["tool"] and {"jsonl", "hf", "embedded"} <= set(table["data_source"])
  assert any(line.startswith("environment: ") and "guess" in line for line in out.splitlines())


def test_check_conversion_command(hf_dirs, capsys):
  report = cli.main(["check-conversion", hf_dirs["qwen2"]])
  assert report["max_abs_diff"] <= 1e-4
  assert "max abs logit diff" in capsys.readouterr().out


def test_eval_and_convert_a_run(tmp_path):
  run_dir = str(tmp_path / "run")
  with xla_cache.off():  # as in a process without JAX_COMPILATION_CACHE_DIR
    cli.main(tiny.args("grpo", run_dir, {"train.steps": "1"}))
  assert os.listdir(os.path.join(run_dir, "xla_cache"))  # train.compilation_cache, default on
  config_path = os.path.join(tiny.ROOT, "configs", "algos", "grpo.py")
  overrides = [f"--config.{k}={v}" for k, v in tiny.OVERRIDES.items()]
  result = cli.main(["eval", "--config", config_path, *overrides, "--checkpoint", run_dir,
                     "--samples", "2"])
  assert result["num_problems"] == 4
  assert 0 <= result["pass@1"] <= 1 and "maj@2" in result
  assert 0 <= result["pass@1_sampled"] <= result["pass@2"] <= 1
  out = str(tmp_path / "hf")
  cli.main(["convert", run_dir, out])
  from rljax.train import evaluation
  model_cfg, params = evaluation.load_run_params(run_dir)
  tokens, mask = hf_models.left_padded([5, 3], width=5, vocab=model_cfg.vocab_size, seed=1)
  ours = np.asarray(transformer.logits(model_cfg, params, tokens, mask))
  theirs = hf_models.hf_logits(out, tokens, mask)
  assert np.abs(ours - theirs)[mask.astype(bool)].max() <= 1e-4
  with pytest.raises(UsageError, match=r"^convert --format peft: .* trained no adapters "
                                       r"\(model.lora.rank=0\); export its weights with "
                                       r"--format merged$"):
    cli.main(["convert", run_dir, str(tmp_path / "adapter"), "--format", "peft"])
  assert not os.path.exists(tmp_path / "adapter")


LORA = {"model.lora.rank": "4", "model.lora.alpha": "8.0", "model.lora.targets": "('all',)"}


def test_convert_a_lora_run_to_peft_and_merged(tmp_path):
  """A LoRA run started from a PEFT adapter (model.lora.init_from, non-zero B) exports a PEFT
  adapter that peft + transformers load onto the base and merged weights that transformers
  loads, both with the logits of rljax's adapted forward."""
  import peft  # installed by the test bootstrap (rljax[peft])
  import torch
  import transformers
  from rljax.data import tokenizer as tokenizer_lib
  from rljax.models import hf, lora, peft as rpeft, transformer
  from rljax.train import build, evaluation
  run_dir = str(tmp_path / "run")
  train_args = tiny.args("grpo", run_dir, dict(LORA, **{"train.steps": "1"}))
  config = config_loader.load_config(train_args[2], [
      tuple(a[len("--config."):].split("=", 1)) for a in train_args[3:]])
  tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer, config.data.chat_template)
  model_cfg, params = build.load_policy(config, tokenizer)
  base, fresh = lora.split_adapters(params)
  rng = np.random.default_rng(0)
  start = jax.tree.map(lambda x: (0.1 * rng.standard_normal(x.shape)).astype(np.float32), fresh)
  rpeft.save_peft_adapter(str(tmp_path / "start"), model_cfg, start, base_model=None)
  base_dir = str(tmp_path / "base")
  hf.save_hf(base_dir, model_cfg.base, base)

  cli.main(train_args + [f"--config.model.lora.init_from={tmp_path / 'start'}"])
  _, trained = evaluation.load_run_params(run_dir, merged=False)
  for (path, a), (_, b) in zip(hf._flat_paths(start), hf._flat_paths(trained)):
    # the run started from the adapter (a fresh start has B = 0) and took one small step
    np.testing.assert_allclose(np.asarray(b), a, atol=0.02, err_msg="/".join(path))
  cli.main(["convert", run_dir, str(tmp_path / "adapter")])  # a LoRA run's default: peft
  cli.main(["convert", run_dir, str(tmp_path / "merged"), "--format", "merged"])

  tokens, mask = hf_models.left_padded([5, 3], width=5, vocab=model_cfg.vocab_size, seed=1)
  valid = mask.astype(bool)
  ours = np.asarray(transformer.logits(model_cfg, lora.join_adapters(base, trained), tokens,
                                       mask), np.float64)
  merged = hf_models.hf_logits(str(tmp_path / "merged"), tokens, mask)
  assert np.abs(ours - merged)[valid].max() <= 1e-4
  model = peft.PeftModel.from_pretrained(
      transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
      str(tmp_path / "adapter"))
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    adapted = model.eval()(input_ids=torch.tensor(tokens, dtype=torch.long),
                           attention_mask=torch.tensor(mask, dtype=torch.long),
                           position_ids=torch.tensor(pos, dtype=torch.long)).logits.double()
  assert np.abs(ours - adapted.numpy())[valid].max() <= 1e-4


def test_training_on_a_jsonl_file_with_math_verify(tmp_path):
  data = tmp_path / "problems.jsonl"
  rows = [f'{{"prompt": "what is {a}+{b}? ", "answer": "#### {a + b}"}}'
          for a in range(10) for b in range(10)]
  data.write_text("\n".join(rows) + "\n")
  run_dir = str(tmp_path / "run")
  result = cli.main(tiny.args("grpo", run_dir, {"data.source": f"jsonl:{data}",
                                                "reward.fn": "math_verify"}))
  assert result["last"]["reward_mean"] >= 0 and np.isfinite(result["last"]["loss"])
  assert int(result["state"].step) == 2


def test_train_splits_the_cpu_into_a_device_per_core(tmp_path):
  """``python -m rljax train`` in a fresh process makes one JAX device per core (at most as
  many as the 2 prompts of a step split over) before JAX starts, and trains on them."""
  import subprocess
  import sys
  from tests.parallel.conftest import REPO
  run_dir = str(tmp_path / "run")
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
  # The tiny settings with a built-in reward (the tests' own is registered in this process only).
  args = tiny.args("grpo", run_dir, {"reward.fn": "exact_match"})
  proc = subprocess.run([sys.executable, "-m", "rljax"] + args,
                        env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  want = min(len(os.sched_getaffinity(0)), 2)
  line = f"the CPU split into {want} JAX devices"
  assert (line in proc.stdout) == (want > 1), proc.stdout[-2000:]
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    assert sum("loss" in json.loads(row) for row in f) == 2

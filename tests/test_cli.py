"""The command line: config overrides, components, check-conversion, eval and convert."""
import json
import os

import jax
import numpy as np
import pytest

from rljax import cli, config_loader
from rljax.models import llama
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
  assert {"advantage", "policy_loss", "loss_agg", "kl_estimator", "reward_fn"} <= set(table)
  out = capsys.readouterr().out
  # Tests may have registered more environments by now: the embedded ones must be listed.
  assert "cispo" in out and {"guess", "tool_calc"} <= set(table["env"]) and "calc" in table["tool"]
  assert any(line.startswith("env: ") and "guess" in line for line in out.splitlines())


def test_check_conversion_command(hf_dirs, capsys):
  report = cli.main(["check-conversion", hf_dirs["qwen2"]])
  assert report["max_abs_diff"] <= 1e-4
  assert "max abs logit diff" in capsys.readouterr().out


def test_eval_and_convert_a_run(tmp_path):
  run_dir = str(tmp_path / "run")
  with xla_cache.off():  # as in a process without JAX_COMPILATION_CACHE_DIR
    cli.main(tiny.args("grpo", run_dir, {"train.steps": "1"}))
  assert os.listdir(os.path.join(run_dir, "xla_cache"))  # train.compilation_cache, default on
  config_path = os.path.join(tiny.ROOT, "configs", "grpo.py")
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
  ours = np.asarray(llama.logits(model_cfg, params, tokens, mask))
  theirs = hf_models.hf_logits(out, tokens, mask)
  assert np.abs(ours - theirs)[mask.astype(bool)].max() <= 1e-4


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

"""Start-up validation: each bad value fails in under a second with an error naming the key,
before any model, data or compiled function is built."""
import glob
import os
import time

import numpy as np
import pytest

from rljax import cli
from rljax.config import checks as config_checks, loader as config_loader
from rljax.train import build, loop, policy
from tests.train import tiny

BASE = os.path.join(tiny.ROOT, "configs", "base.py")

# (preset, overrides, text the one-line error must contain)
BAD = [
    ("grpo", {"algo.clip_eps_low": "-0.2"}, "algo.clip_eps_low=-0.2"),
    ("grpo", {"algo.clip_eps_high": "-0.1"}, "algo.clip_eps_high=-0.1"),
    ("grpo", {"optim.lr": "0"}, "optim.lr=0.0"),
    ("grpo", {"optim.lr": "-1e-5"}, "optim.lr=-1e-05"),
    ("grpo", {"optim.lr": "nan"}, "optim.lr=nan is not allowed: expected a finite number"),
    ("grpo", {"optim.lr": "inf"}, "optim.lr=inf"),
    ("grpo", {"optim.eps": "0"}, "optim.eps=0.0"),
    ("grpo", {"optim.b1": "1.0"}, "optim.b1=1.0"),
    ("grpo", {"optim.b2": "1.0"}, "optim.b2=1.0 is not allowed: expected a finite number in [0, 1)"),
    ("grpo", {"optim.b2": "-0.1"}, "optim.b2=-0.1"),
    ("grpo", {"optim.weight_decay": "-1"}, "optim.weight_decay"),
    ("grpo", {"optim.warmup_steps": "-3"}, "optim.warmup_steps=-3"),
    ("grpo", {"optim.schedule": "linear"}, "optim.schedule='linear'"),
    ("grpo", {"train.steps": "0"}, "train.steps=0"),
    ("grpo", {"train.steps": "-5"}, "train.steps=-5"),
    ("grpo", {"train.checkpoint_every": "-1"}, "train.checkpoint_every=-1"),
    ("grpo", {"train.eval_every": "-2"}, "train.eval_every=-2"),
    ("grpo", {"train.keep_checkpoints": "0"}, "train.keep_checkpoints=0"),
    ("grpo", {"rollout.group_size": "1"}, "rollout.group_size=1 with algo.advantage='grpo'"),
    ("rloo", {"rollout.group_size": "1"}, "rollout.group_size=1 with algo.advantage='rloo'"),
    ("grpo", {"rollout.group_size": "0"}, "rollout.group_size=0"),
    ("grpo", {"rollout.temperature": "0"}, "rollout.temperature=0.0"),
    ("grpo", {"rollout.top_p": "1.5"}, "rollout.top_p=1.5"),
    ("grpo", {"rollout.top_k": "-1"}, "rollout.top_k=-1"),
    ("grpo", {"rollout.max_new_tokens": "0"}, "rollout.max_new_tokens=0"),
    ("grpo", {"reward.timeout_s": "0"}, "reward.timeout_s=0.0"),
    ("grpo", {"reward.workers": "-1"}, "reward.workers=-1"),
    ("grpo", {"algo.kl_coef": "-0.1"}, "algo.kl_coef=-0.1"),
    ("grpo", {"algo.gamma": "1.5"}, "algo.gamma=1.5"),
    ("grpo", {"algo.lam": "nan"}, "algo.lam=nan"),
    ("grpo", {"algo.dual_clip_c": "0.5"}, "algo.dual_clip_c=0.5"),
    ("grpo", {"algo.ref_ema_decay": "2"}, "algo.ref_ema_decay=2.0"),
    ("grpo", {"algo.keep_pass_rate": "(0.9, 0.1)"}, "algo.keep_pass_rate=(0.9, 0.1)"),
    ("grpo", {"algo.epochs": "0"}, "algo.epochs=0"),
    ("grpo", {"algo.minibatches": "3"}, "do not split into algo.minibatches=3"),
    ("grpo", {"data.num_eval": "0"}, "data.num_eval=0"),
    ("grpo", {"data.prompt_bucket": "0"}, "data.prompt_bucket=0"),
    ("grpo", {"data.max_prompt_tokens": "-1"}, "data.max_prompt_tokens=-1"),
    ("grpo", {"data.overlong_prompts": "truncate"}, "data.overlong_prompts='truncate'"),
    ("grpo", {"model.num_heads": "3"}, "model.hidden_size=32 must be a multiple of"),
    ("grpo", {"model.matmul_precision": "fast"}, "model.matmul_precision='fast'"),
    ("grpo", {"sft.steps": "0"}, "sft.steps=0"),
    ("grpo", {"model.source": "sft", "sft.steps": "30"},
     "sft.warmup_steps=50 is more than sft.steps=30"),
    ("grpo", {"mesh.data": "0"}, "mesh.data=0"),
    ("grpo", {"mesh.expert": "0"}, "mesh.expert=0"),
    ("grpo", {"mesh.expert": "-1"}, "only one mesh axis may be -1 (the devices the others leave), "
     "got mesh.data, mesh.expert"),
    ("grpo", {"critic.lr": "-1"}, "critic.lr=-1.0"),
    ("grpo", {"seed": "-1"}, "seed=-1"),
    ("grpo", {"algo.rollout_is": "seq"}, "algo.rollout_is='seq'"),
    ("grpo", {"algo.rollout_is_cap": "0"}, "algo.rollout_is_cap=0.0"),
    ("grpo", {"algo.sapo_tau_pos": "0"}, "algo.sapo_tau_pos=0.0"),
    ("grpo", {"algo.clip_cov_ratio": "2"}, "algo.clip_cov_ratio=2.0"),
    ("grpo", {"algo.passk_k": "0"}, "algo.passk_k=0"),
    ("grpo", {"algo.opd_discount": "1.5"}, "algo.opd_discount=1.5"),
    ("grpo", {"algo.entropy_ctrl_estimate": "mean"}, "algo.entropy_ctrl_estimate='mean'"),
    ("grpo", {"teacher.dtype": "int8"}, "teacher.dtype='int8'"),
    ("opd", {"teacher.source": ""}, "algo.opd_coef=1.0 needs a distillation teacher"),
    # DAPO's soft overlong punishment starts max_new_tokens - overlong_buffer tokens in.
    ("dapo", {"reward.overlong_buffer": "9"},
     "reward.overlong_buffer=9 is larger than rollout.max_new_tokens=8"),
    # Keys nothing reads, refused from their read_if declarations alone.
    ("grpo", {"critic.value_clip": "0.3"},
     "critic.value_clip=0.3 is not used: there is no critic (critic.enabled=False)"),
    ("grpo", {"model.source": "hf:/nowhere", "model.family": "qwen3"},
     "model.family='qwen3' is not used: model.source='hf:/nowhere' brings its own architecture"),
    ("grpo", {"teacher.source": "tiny"}, "teacher.source='tiny' is not used: there is no "
     "distillation (algo.opd_coef=0)"),
    ("grpo", {"env.slots": "4"}, "env.slots=4 is not used: rollouts are single-turn"),
]


@pytest.fixture
def nothing_is_built(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("a model or run was built before the config was checked")
  monkeypatch.setattr(build, "build_run", refuse)
  monkeypatch.setattr(policy, "load_policy", refuse)
  monkeypatch.setattr(loop, "train", refuse)


@pytest.mark.parametrize("preset,overrides,message", BAD,
                         ids=[f"{p}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for p, o, _ in BAD])
def test_bad_value_fails_fast_naming_the_key(preset, overrides, message, nothing_is_built,
                                             tmp_path):
  start = time.monotonic()
  with pytest.raises(config_checks.ConfigError) as info:
    cli.main(tiny.args(preset, str(tmp_path / "run"), overrides))
  assert time.monotonic() - start < 1.0
  assert message in str(info.value)
  assert "\n" not in str(info.value)
  assert not os.path.exists(tmp_path / "run")


def test_eval_samples_and_one_line_cli_error(nothing_is_built, capsys):
  with pytest.raises(config_checks.ConfigError, match="--samples=0"):
    cli.main(["eval", "--config", BASE, "--samples", "0"])
  with pytest.raises(SystemExit) as info:
    cli.entry(["train", "--config", BASE, "--config.optim.b2=1.0"])
  assert info.value.code == 2  # a user error, not an internal one (1)
  assert capsys.readouterr().err.startswith("error: optim.b2=1.0 is not allowed")


def _every_config_file():
  """configs/base.py and every preset, job, study base and task under configs/."""
  root = os.path.join(tiny.ROOT, "configs")
  paths = sorted(glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "*", "*.py")))
  assert len(paths) > 30 and os.path.join(root, "jobs", "main.py") in paths
  return paths


def test_defaults_and_every_preset_pass():
  for path in _every_config_file():
    config_checks.check_config(config_loader.load_config(path))


def test_every_key_of_every_config_is_declared_and_g1_is_fine_without_groups():
  from rljax.config.table import KEY_BY_NAME
  from rljax.runs.run_dir import flatten_config
  for path in _every_config_file():
    config = config_loader.load_config(path)
    # The plans (configs/jobs/qwen*) carry plan.*, read by `rljax plan` only.
    undeclared = {k for k in flatten_config(config.to_dict())
                  if k not in KEY_BY_NAME and not k.startswith("plan.")}
    assert not undeclared, (path, undeclared)
  ppo = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "ppo.py"),
                                  [("rollout.group_size", "1")])
  config_checks.check_config(ppo)  # GAE needs no group


def test_overlong_buffer_may_be_the_whole_budget():
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "dapo.py"),
                                     [("rollout.max_new_tokens", "16")])
  config_checks.check_config(config)  # buffer 16 of 16: the punishment ramps from the start
  from rljax.rewards import shaping
  penalty = shaping.overlong_penalty(np.asarray([0, 8, 16]), max_new_tokens=16, overlong_buffer=16,
                                     overlong_penalty=1.0)
  assert list(map(float, penalty)) == [0.0, -0.5, -1.0]  # (16 - 16 - |o|) / 16


def test_nan_parses_as_a_float_not_a_type_error():
  config = config_loader.load_config(BASE, [("algo.entropy_coef", "-inf")])
  assert config.algo.entropy_coef == float("-inf")
  with pytest.raises(config_checks.ConfigError, match="algo.entropy_coef=-inf"):
    config_checks.check_config(config)


def test_docs_config_table_is_generated_from_the_declarations():
  from rljax.config import relations, table, declare
  with open(os.path.join(tiny.ROOT, "docs", "config.md")) as f:
    assert f.read() == declare.markdown_table(table.KEYS, relations.RELATIONS), (
        "docs/config.md is stale: python -m rljax keys --markdown > docs/config.md")


def test_rljax_keys_prints_default_check_and_doc(capsys):
  cli.main(["keys", "algo.dual_clip_c"])
  out = capsys.readouterr().out
  assert "algo.dual_clip_c = None" in out and "(1, inf)" in out and "dual-clip" in out

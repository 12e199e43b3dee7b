"""Multi-turn RL on a mesh: two steps of configs/tasks/guess.py (the turn-synchronous engine,
sampled at temperature 1, episodes stepped in the worker processes) on 8 simulated CPU devices, data
4 x fsdp 2, draw the same episodes and train the same losses as on one device.

Both runs are `python -m rljax train` subprocesses (one with 8 devices, one with 1), started
together."""
import json
import os
import subprocess
import sys

import pytest

from tests.envs.test_train_smoke import TINY
from tests.parallel.conftest import REPO, device_env

# What the episodes were (same tokens, turns and rewards) and what the update did with them.
EXACT = ("generated_tokens", "env/policy_tokens", "env/env_tokens", "env/turns", "env/tool_calls",
         "env/episodes", "reward_mean")
CLOSE = ("loss", "grad_norm", "entropy", "mismatch/train_ppl")


def _start(run_dir, devices: int, mesh: dict):
  # Prompts split over the data-parallel width (data x fsdp = 8) in both runs.
  overrides = dict(TINY, **{"train.run_dir": str(run_dir), "train.steps": "2",
                            "rollout.prompts_per_step": "8", "rollout.group_size": "2",
                            "data.num_eval": "8",
                            # A random policy rarely finds the number: the entropy bonus gives
                            # every step a gradient whatever the rewards.
                            "algo.entropy_coef": "0.01"}, **mesh)
  cmd = [sys.executable, "-m", "rljax", "train", "--config", os.path.join(REPO, "configs",
                                                                          "tasks", "guess.py")]
  cmd += [f"--config.{k}={v}" for k, v in overrides.items()]
  return subprocess.Popen(cmd, env=device_env(devices), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _records(proc, run_dir):
  out, _ = proc.communicate(timeout=900)
  assert proc.returncode == 0, out[-4000:]
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _trained(records):
  return [m for m in records if "loss" in m]


@pytest.mark.slow
def test_guess_on_eight_devices_trains_as_on_one(tmp_path):
  one = _start(tmp_path / "one", 1, {})
  eight = _start(tmp_path / "eight", 8, {"mesh.data": "4", "mesh.fsdp": "2"})
  records = _records(one, tmp_path / "one")
  ref, got = _trained(records), _trained(_records(eight, tmp_path / "eight"))
  assert len(ref) == len(got) == 2
  _assert_a_multi_turn_run(records, episodes=8 * 2)
  for a, b in zip(ref, got):
    for key in EXACT:
      assert a[key] == b[key], (key, a[key], b[key])
    for key in CLOSE:
      assert abs(a[key] - b[key]) <= 1e-5 * (1 + abs(a[key])), (key, a[key], b[key])
  # Not vacuous: the updates moved the policy, and the second step drew other episodes.
  assert min(m["grad_norm"] for m in ref) > 0 and ref[0]["loss"] != ref[1]["loss"]


def _assert_a_multi_turn_run(records, episodes):
  """The one-device run is also configs/tasks/guess.py's turn-synchronous end-to-end run
  (tests/envs/test_train_smoke.py runs the async_turns engine in process): the evals before and
  after training count turns and tool calls, every step's episodes were played in 1-5 turns, the
  trained tokens are the policy's, and the trainer's log-probs are the sampler's (its forward saw
  the observations)."""
  evals = [m for m in records if "eval_accuracy" in m]
  assert [m["step"] for m in evals] == [0, 2], evals
  for m in evals:
    assert 0.0 <= m["eval_accuracy"] <= 1.0
    assert 1.0 <= m["eval_turns"] <= 5.0
    assert m["eval_tool_calls"] >= m["eval_tool_errors"] >= 0
    assert "eval_tool_use" in m
  for m in _trained(records):
    assert m["env/episodes"] == episodes and 1 <= m["env/turns_per_episode"] <= 5
    assert m["generated_tokens"] == m["env/policy_tokens"]
    assert m["logp_gap_max"] < 1e-3

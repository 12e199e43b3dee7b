"""``rljax train`` through the endpoint: ``configs/tasks/agent_calc.py``'s harness (ordinary ``openai``
client code in worker processes) plays every episode against the run's engine; the trainer's
forward over the recorded ids reproduces the sampler's log-probs (no re-tokenisation anywhere),
and the asynchronous pipeline records the weights' version of every call."""
import json
import os

from rljax import cli
from tests.train import tiny


def _train(tmp_path, **extra):
  run_dir = str(tmp_path / "run")
  overrides = {
      "model.source": "tiny", "model.hidden_size": "32", "model.intermediate_size": "64",
      "model.num_layers": "1", "model.num_heads": "2", "model.num_kv_heads": "1",
      "rollout.prompts_per_step": "2", "rollout.group_size": "2", "data.num_eval": "2",
      "train.steps": "2", "train.eval_every": "0", "train.progress": "false",
      "train.export_hf": "false", "train.run_dir": run_dir, "env.harness_workers": "4",
      **extra}
  cli.main(["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "agent_calc.py")]
           + [f"--config.{k}={v}" for k, v in overrides.items()])
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [m for m in map(json.loads, f) if "loss" in m]


def test_an_openai_client_harness_trains_through_rljax_train(tmp_path):
  steps = _train(tmp_path, **{"rollout.max_staleness": "1"})
  assert len(steps) == 2
  for step in steps:
    assert step["env/episodes"] == 4 and step["agent/calls"] >= 4
    assert step["env/errors"] == 0 and step["env/timeouts"] == 0
    assert step["logp_gap_max"] < 1e-3
    assert step["generated_tokens"] == step["env/policy_tokens"]

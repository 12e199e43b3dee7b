"""configs/tasks/guess.py end to end at a tiny size: two RL steps of multi-turn rollouts through the
train loop (rollout mode switch, scoring with environment tokens attended, the update, evals with
turns and tool calls), and the start-up checks of the env keys."""
import json
import os

import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.config.checks import ConfigError, check_config
from tests.train import tiny

TINY = {
    "model.source": "tiny", "model.hidden_size": "32", "model.intermediate_size": "64",
    "model.num_layers": "1", "model.num_heads": "2", "model.num_kv_heads": "1",
    "rollout.prompts_per_step": "2", "rollout.group_size": "4", "rollout.max_new_tokens": "12",
    "env.max_tokens": "40", "data.num_eval": "4", "train.steps": "2", "train.eval_every": "0",
    "train.progress": "false", "train.export_hf": "false",
}


# The turn-synchronous engine's run (env.engine's default) with these settings and assertions is
# tests/parallel/test_multiturn_mesh.py's one-device run (a subprocess it compares the 8-device
# run with): a third compilation of the same programs here would check nothing more.
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["async_turns"])
def test_guess_two_steps(tmp_path, engine):
  run_dir = str(tmp_path / "run")
  args = ["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "guess.py")]
  args += [f"--config.{k}={v}" for k, v in dict(TINY, **{"train.run_dir": run_dir,
                                                          "env.engine": engine}).items()]
  result = cli.main(args)
  for when in ("before", "after"):
    assert 0.0 <= result[f"eval_{when}"] <= 1.0
    assert 1.0 <= result[f"eval_{when}_turns"] <= 5.0
    assert result[f"eval_{when}_tool_calls"] >= result[f"eval_{when}_tool_errors"] >= 0
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    steps = [json.loads(line) for line in f]
  trained = [m for m in steps if "loss" in m]
  assert len(trained) == 2
  for m in trained:
    assert m["env/episodes"] == 8 and 1 <= m["env/turns_per_episode"] <= 5
    assert m["generated_tokens"] == m["env/policy_tokens"]
    # The sampler's and the trainer's log-probs agree: the forward saw the observations.
    assert m["logp_gap_max"] < 1e-3
  assert "eval_turns" in steps[0] and "eval_tool_use" in steps[-1]


def _config(**overrides):
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "tasks", "guess.py"),
                                   [(k, str(v)) for k, v in overrides.items()])


def test_env_key_checks():
  check_config(_config())
  with pytest.raises(ConfigError, match=r"reward.fn='test_char_sum_mod4' is not used: "
                                        r"env.name='guess' scores"):
    check_config(_config(**{"reward.fn": tiny.REWARD}))
  with pytest.raises(ConfigError, match="reward.overlong_buffer=4 is not used"):
    check_config(_config(**{"reward.overlong_buffer": 4}))
  with pytest.raises(ConfigError, match="the char tokenizer has no braces"):
    check_config(_config(**{"env.tool_format": "hermes"}))
  single = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                     [("env.max_turns", "3")])
  with pytest.raises(ConfigError, match=r"env.max_turns=3 is not used: rollouts are single-turn"):
    check_config(single)
  with pytest.raises(ConfigError, match=r"env.slots=8 is not used: env.engine='turn_sync' does "
                                        r"not read it; it is read by episode engine .* "
                                        r"'async_turns'"):
    check_config(_config(**{"env.slots": 8}))
  check_config(_config(**{"env.slots": 8, "env.engine": "async_turns"}))
  single = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", "grpo.py"),
                                     [("env.engine", "async_turns")])
  with pytest.raises(ConfigError, match=r"env.engine='async_turns' is not used"):
    check_config(single)
  with pytest.raises(ConfigError, match=r"env.turn_discount=0.9 is not used: algo.advantage="
                                        r"'grpo' reads one reward per episode; .*reinforce_pp"):
    check_config(_config(**{"env.turn_discount": 0.9}))
  check_config(_config(**{"env.turn_discount": 0.9, "algo.advantage": "reinforce_pp"}))
  with pytest.raises(ConfigError, match=r"model.router_replay='R3' .*env.name='guess'.*'R2'"):
    check_config(_config(**{"model.router_replay": "R3"}))
  check_config(_config(**{"model.router_replay": "R2"}))
  with pytest.raises(ConfigError, match=r"env.engine.*async_turns, .*turn_sync"):
    check_config(_config(**{"env.engine": "async"}))
  with pytest.raises(ConfigError, match="registered environment name: .*guess.*tool_calc"):
    check_config(_config(**{"env.name": "gues"}))

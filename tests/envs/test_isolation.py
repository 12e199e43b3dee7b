"""Environment calls run in the verifiers' killable workers: a step that hangs, kills its process
or raises, and a reset that fails, cost only their own trajectories (reward 0, counted), never the
batch or the run."""
import os
import time

import jax
import numpy as np

from rljax.data.tasks import Problem
from rljax.envs import Environment, StepResult, register_env
from rljax.envs.episodes import EnvSettings, run_episodes
from tests.envs.test_driver import SP, TOK, ScriptedPolicy

FLAKY = "test_flaky"


if FLAKY not in __import__("rljax.envs", fromlist=["ENVS"]).ENVS:
  # Registered by a test module (module level: the forked workers unpickle it by reference).
  @register_env(FLAKY)
  class Flaky(Environment):
    """The prompt says what the first step does: hang, crash (the process dies), raise, return
    garbage, or answer 'ok' (then the next turn is rewarded)."""

    def reset(self, problem):
      if problem.prompt == "badreset:":
        raise RuntimeError("no such problem")
      self.turn = 0
      return problem.prompt

    def step(self, action):
      self.turn += 1
      if "hang" in action:
        while True:
          pass
      if "crash" in action:
        os._exit(3)
      if "raise" in action:
        raise ValueError("bug in the environment")
      if "garbage" in action:
        return object()
      if self.turn == 1:
        return StepResult(" ok\n", 0.25, False, {})
      return StepResult("", 1.0, True, {"correct": True})


def test_failures_cost_only_their_trajectory():
  prompts = ["hang:", "crash:", "raise:", "garbage:", "fine:", "badreset:"]
  problems = [Problem(prompt=p, answer="1") for p in prompts]
  # Every row writes its prompt's word as its first turn, then "done".
  policy = ScriptedPolicy(lambda text, member: text.split(":")[0] if text.endswith(":")
                          else "done")
  settings = EnvSettings(name=FLAKY, max_turns=3, max_tokens=32, timeout_s=1.0, workers=2)
  t0 = time.monotonic()
  result = run_episodes(problems, jax.random.PRNGKey(0), generate=policy, tokenizer=TOK,
                        settings=settings, sampling=SP, group_size=2, prompt_bucket=16)
  assert time.monotonic() - t0 < 20
  ends = [e.end for e in result.episodes]
  assert ends == ["timeout"] * 2 + ["error"] * 6 + ["done"] * 2 + ["error"] * 2
  assert "died" in result.episodes[2].error and "ValueError" in result.episodes[4].error
  assert "no such problem" in result.episodes[10].error
  r = result.rollout
  np.testing.assert_array_equal(r.rewards, [0] * 8 + [1.25] * 2 + [0] * 2)
  np.testing.assert_array_equal(r.correct, [False] * 8 + [True] * 2 + [False] * 2)
  assert result.counts["env/timeouts"] == 2 and result.counts["env/errors"] == 8
  # The failed rows keep what they sampled (the loss sees it, rewarded 0); the failed resets
  # sampled nothing that counts.
  assert r.mask[0].sum() == len("hang") + 1 and r.mask[10].sum() == 0
  assert result.episodes[8].turn_rewards == [0.25, 1.0]
  # The pool is usable afterwards (killed workers were replaced).
  again = run_episodes(problems[4:5], jax.random.PRNGKey(1), generate=policy, tokenizer=TOK,
                       settings=settings, sampling=SP, group_size=1, prompt_bucket=16)
  assert again.episodes[0].end == "done" and again.rollout.rewards[0] == 1.25

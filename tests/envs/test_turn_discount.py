"""``env.turn_discount``: per-turn rewards at each turn's last policy token, discounted across
turns, checked against a hand-worked episode through the driver and the token estimators."""
import jax
import numpy as np
import pytest

from rljax import algos
from rljax.data.tasks import Problem
from rljax.envs import ENVS, Environment, StepResult, register_env
from rljax.envs.episodes import EnvSettings, run_episodes, turn_token_rewards
from tests.envs.test_driver import SP, TOK, ScriptedPolicy

PAYER = "test_payer"

if PAYER not in ENVS:
  @register_env(PAYER)  # module level: the workers unpickle it by reference
  class Payer(Environment):
    """Three turns rewarded 0.25, 0 and 1; every observation is ' ok'."""

    def reset(self, problem):
      self.turn = 0
      return problem.prompt

    def step(self, action):
      self.turn += 1
      reward = {1: 0.25, 2: 0.0, 3: 1.0}[self.turn]
      return StepResult(" ok", reward, self.turn == 3, {"correct": self.turn == 3})


def test_hand_worked_turn_discount():
  """Turns 'ab', 'cde', 'f' (each + EOS) rewarded 0.25, 0, 1 with d = 0.5: the returns from the
  turns are R3 = 1, R2 = 0 + 0.5 * 1 = 0.5, R1 = 0.25 + 0.5 * 0.5 = 0.5, so the token rewards
  are R1 - R2 = 0 at 'ab''s EOS, R2 - R3 = -0.5 at 'cde''s, 1 at 'f''s; REINFORCE++ / GAE
  (gamma 1, lam 1, V = 0) returns-to-go are 0.5 on turn 1, 0.5 on turn 2, 1 on turn 3, and the
  episode's reward (outcome estimators) stays 1.25."""
  turns = iter(["ab", "cde", "f"] * 2)
  policy = ScriptedPolicy(lambda text, member: next(turns))
  settings = EnvSettings(name=PAYER, max_turns=3, max_tokens=24, workers=1, turn_discount=0.5)
  r = run_episodes([Problem("go:", "")], jax.random.PRNGKey(0), generate=policy, tokenizer=TOK,
                   settings=settings, sampling=SP, group_size=1, prompt_bucket=8).rollout
  # ids: a b EOS ' ' o k c d e EOS ' ' o k f EOS
  expected = np.zeros(24, np.float32)
  expected[[2, 9, 14]] = [0.0, -0.5, 1.0]
  np.testing.assert_allclose(r.extras["token_rewards"][0], expected)
  mask = r.mask.astype(np.float32)
  returns = np.asarray(algos.discounted_returns(r.extras["token_rewards"], mask, 1.0))[0]
  np.testing.assert_allclose(returns[:15], [0.5] * 3 + [0] * 3 + [0.5] * 4 + [0] * 3 + [1.0] * 2)
  gae = np.asarray(algos.gae_advantages(r.extras["token_rewards"], np.zeros_like(mask), mask,
                                        gamma=1.0, lam=1.0))[0]
  np.testing.assert_allclose(gae, returns)
  assert r.rewards[0] == 1.25
  # d = 1 (the default) keeps today's record: the summed reward on the last token.
  undiscounted = run_episodes([Problem("go:", "")], jax.random.PRNGKey(0), generate=policy,
                              tokenizer=TOK, settings=EnvSettings(name=PAYER, max_turns=3,
                                                                  max_tokens=24, workers=1),
                              sampling=SP, group_size=1, prompt_bucket=8).rollout
  assert "token_rewards" not in undiscounted.extras


@pytest.mark.parametrize("rewards,ends,d", [([1.0, 2.0, 3.0], [1, 4, 8], 0.9),
                                            ([0.0, 1.0], [3, 5], 0.0), ([2.0], [6], 0.3)])
def test_turn_token_rewards_telescope(rewards, ends, d):
  """Every token of turn k sees sum_{j>=k} d^(j-k) r_j (a direct sum, not the recursion)."""
  x = turn_token_rewards(rewards, ends, d, 10)
  rtg = np.cumsum(x[::-1])[::-1]
  start = 0
  for k, end in enumerate(ends):
    want = sum(d ** (j - k) * rewards[j] for j in range(k, len(rewards)))
    np.testing.assert_allclose(rtg[start:end + 1], want, rtol=1e-6)
    start = end + 1

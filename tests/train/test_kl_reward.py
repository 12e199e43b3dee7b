"""KL in the reward with an outcome estimator: GRPO's R_i becomes R_i - beta * sum_t k1 (the row's
summed per-token penalty), from a float64 reference of both policies' log-probs."""
import jax
import numpy as np

from tests.train.test_transforms_in_trainer import G, _config, _reference_logp, _rollout, _setup


def test_grpo_reads_the_reward_less_the_rows_summed_kl_penalty():
  config = _config("grpo", **{"algo.kl_placement": "reward", "algo.kl_estimator": "k1",
                              "algo.kl_coef": 0.5})
  fns, state, hp, model_cfg, params = _setup(config)
  reference = jax.tree.map(lambda p: p * 1.3, params)
  state = state.replace(ref_params=reference)
  rollout = _rollout(3)
  scored, _ = jax.jit(fns.score)(state, rollout, hp)
  m = rollout.mask.astype(np.float64)
  k1 = (_reference_logp(model_cfg, params, rollout)
        - _reference_logp(model_cfg, reference, rollout)) * m
  rewards = (rollout.rewards - 0.5 * k1.sum(1)).reshape(-1, G)
  a = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, ddof=1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(np.asarray(scored.advantages), a.reshape(-1, 1) * m,
                             rtol=1e-4, atol=1e-4)
  # Without the penalty the advantages would be those of the outcome alone: the KL acts.
  plain = rollout.rewards.reshape(-1, G).astype(np.float64)
  plain = (plain - plain.mean(1, keepdims=True)) / (plain.std(1, ddof=1, keepdims=True) + 1e-6)
  assert np.abs(a.reshape(-1) - plain.reshape(-1)).max() > 1e-2

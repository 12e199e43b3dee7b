"""Non-finite updates: a step that would make any parameter non-finite is skipped and counted,
and a run whose updates keep being skipped stops with one clear error, parameters intact."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.config import loader as config_loader
from rljax.train import loop
from rljax.learner import initial, state as state_lib
from rljax.learner import update as update_lib
from tests.train import tiny


def _nan_from_finite_gradients():
  """AdamW whose bias correction divides by 1 - b2^t = 0: finite gradients, NaN parameters."""
  return optax.adam(1e-3, b2=1.0)


def test_apply_update_skips_a_step_that_makes_parameters_non_finite():
  params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
  grads = {"w": jnp.full(3, 0.5), "b": jnp.full(2, -0.5)}
  tx = _nan_from_finite_gradients()
  opt_state = tx.init(params)
  unguarded = optax.apply_updates(params, tx.update(grads, opt_state, params)[0])
  assert not np.isfinite(np.asarray(unguarded["w"])).all()  # the update really is poisonous
  new_params, new_opt_state, grad_norm, applied = update_lib.apply_update(
      tx, params, opt_state, grads, jnp.asarray(1.0))
  assert not bool(applied) and np.isfinite(float(grad_norm))
  for a, b in zip(jax.tree.leaves((new_params, new_opt_state)), jax.tree.leaves((params, opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A good optimizer on the same gradients applies the step.
  good = optax.adam(1e-3)
  _, _, _, applied = update_lib.apply_update(good, params, good.init(params), grads,
                                             jnp.asarray(1.0))
  assert bool(applied)


@pytest.mark.slow
def test_a_run_whose_updates_keep_failing_stops_with_the_last_good_parameters(monkeypatch,
                                                                              tmp_path):
  real = state_lib.make_optimizer
  monkeypatch.setattr(initial, "make_optimizer",
                      lambda *a, **k: optax.chain(real(*a, **k), _nan_from_finite_gradients()))
  overrides = dict(tiny.OVERRIDES, **{"train.steps": "5", "train.max_skipped_steps": "2",
                                      "train.run_dir": str(tmp_path / "run")})
  config = config_loader.load_config(tiny.ROOT + "/configs/algos/grpo.py", list(overrides.items()))
  with pytest.raises(FloatingPointError, match="last 2 steps was skipped.*stopped at step 2"):
    loop.train(config)
  from rljax.runs import metrics as metrics_lib
  records = [r for r in metrics_lib.read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
             if "update_skipped" in r]
  assert [r["update_skipped"] for r in records] == [1.0, 1.0]
  assert [r["skipped_updates"] for r in records] == [1.0, 2.0]

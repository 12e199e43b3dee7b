"""FP8 rollouts through ``rljax train`` (``rollout.weight_dtype``): the sampler computes with the
per-channel FP8 round trip of the weights, the learner with its own, so the sampler / trainer
log-prob gap (``logp_gap_mean``, ``mismatch/abs_diff_mean``) and the rollout-correction ratios
(``rollout_is/``) show a mismatch that the full-precision run (the same float32 model on both
sides) does not have; the asynchronous sampler with in-flight updates samples with them too."""
import os

import numpy as np

from rljax import cli
from rljax.runs import metrics as metrics_lib
from tests.train import tiny

CORRECTION = {"algo.rollout_is": "token"}


def _steps(tmp_path, name, extra):
  run_dir = str(tmp_path / name)
  cli.main(tiny.args("grpo", run_dir, dict(CORRECTION, **extra)))
  records = metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return [r for r in records if "loss" in r]


def test_fp8_sampling_shows_a_log_prob_gap_full_precision_does_not(tmp_path):
  full = _steps(tmp_path, "full", {})
  fp8 = _steps(tmp_path, "fp8", {"rollout.weight_dtype": "float8_e4m3fn"})
  assert len(full) == len(fp8) == 2
  for record in full:
    # Sampler and trainer compute the same float32 model: only the order of float operations
    # differs (measured ~1e-7).
    assert record["logp_gap_mean"] < 1e-5 and record["mismatch/abs_diff_mean"] < 1e-5
    assert abs(record["rollout_is/max"] - 1) < 1e-5 and abs(record["rollout_is/min"] - 1) < 1e-5
  for record in fp8:
    # e4m3 keeps 3 mantissa bits (relative weight error up to 2^-4); the tiny random model's
    # near-uniform logits move its log-probs by ~6e-4 (measured), 100x the float32 run's bound.
    assert record["logp_gap_mean"] > 1e-4 and record["mismatch/abs_diff_mean"] > 1e-4
    np.testing.assert_allclose(record["logp_gap_mean"], record["mismatch/abs_diff_mean"],
                               rtol=1e-5)  # two computations of one mean |old - sampler|
    assert record["rollout_is/max"] > 1 + 1e-4 and record["rollout_is/min"] < 1 - 1e-4
    assert np.isfinite(record["loss"])


def test_fp8_weights_reach_the_asynchronous_in_flight_sampler(tmp_path):
  # The first batch is sampled with the learner's step-0 weights (nothing stale yet): its gap is
  # the FP8 round trip's alone (without the key it measured 4e-8); every in-flight chunk loads
  # weights through the same publish.
  steps = _steps(tmp_path, "async", {"rollout.weight_dtype": "float8_e4m3fn",
                                     "rollout.max_staleness": "1", "rollout.inflight_chunk": "4"})
  assert len(steps) == 2
  assert steps[0]["logp_gap_mean"] > 1e-4 and steps[0]["rollout_is/min"] < 1 - 1e-4

"""Asynchronous RL on the main job (configs/jobs/main_600.py), issue 24: the sampler on one CPU
device and the learner on the other (``mesh.sampler_devices=1``), synchronous against
``rollout.max_staleness`` 1 and 2, three seeds. Needs two devices:

  XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
    python -m rljax sweep experiments/async_main.py --root runs/async
  python benchmarks/async_rl.py main --root runs/async      # time to the sync run's accuracy

150 of the main job's 600 steps, an eval every 25 (nine runs in about half an hour on the 2-core machine).
"""
from rljax.sweep.study import Study, independent

SPLIT = {"mesh.sampler_devices": 1}


def get_study():
  return Study(
      name="async_main",
      config="configs/jobs/main_600.py",
      variants=independent([("sync", dict(SPLIT)),
                            ("async1", dict(SPLIT, **{"rollout.max_staleness": 1})),
                            ("async2", dict(SPLIT, **{"rollout.max_staleness": 2}))]),
      seeds=(0, 1, 2),
      # Old log-probs by a scoring forward at the learner's weights, as when the study ran;
      # the main job's 'sampler' would make the stale runs' ratio one against the sampling
      # policy (docs/async.md), another algorithm than the one measured.
      overrides={"train.steps": 150, "train.eval_every": 25, "algo.old_logp": "recompute",
                 "data.num_eval": 256},
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "wall_time_s"),
      baseline="sync",
      description="Sampler and learner on disjoint CPU devices: does sampling ahead with "
                  "weights at most 1 or 2 updates stale reach the synchronous run's held-out "
                  "accuracy sooner in wall time?")

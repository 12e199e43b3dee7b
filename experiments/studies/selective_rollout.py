"""Selective rollouts (GRESO, arXiv 2506.02177): skipping, before sampling, the prompts whose
recent groups were all correct or all wrong saves sampling rounds at no cost in accuracy.

  python -m rljax sweep experiments/studies/selective_rollout.py --root runs/studies

On the main job (configs/jobs/main.py: DAPO with dynamic sampling, 200 RL steps), five seeds: the
main job against the same with ``algo.selective_rollout`` (GRESO's defaults: target 25%
zero-spread groups, exploration probabilities from 0.5). Compared at equal
steps (``gain_accuracy``), per completion generated (``gain_per_1k_samples``) and in wall time.
Its ``dynamic`` arm is the main job, so under one ``--root`` it is shared with
experiments/main_job_seeds.py. Verdict: docs/results/selective_rollout/README.md.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="selective_rollout",
      config="configs/jobs/main.py",
      variants=independent([
          ("dynamic", {}),
          ("selective", {"algo.selective_rollout": True}),
      ]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("gain_accuracy", "final_accuracy", "auc_accuracy", "generated_samples",
               "gain_per_1k_samples", "wall_time_s"),
      baseline="dynamic",
      description="Selective rollouts: fewer sampling rounds at the same accuracy?")

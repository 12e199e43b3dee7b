"""The main job (configs/jobs/main.py) with and without speculative decoding, five seeds each,
paired: the same SFT cold start and, per seed, the same prompts order and sampling keys.

  python -m rljax sweep experiments/main_job_speculative.py --root runs/spec_main --parallel 2

Speculative decoding (rollout.draft='ngram', prompt lookup; rljax.rollout.speculative) is
lossless: each rollout follows plain sampling's distribution, so the trained accuracy must land
in the same interval. The tokens drawn differ (the acceptance tests and residual draws use their
own noise), so the two arms of a seed are two samples of one law, not one trajectory. Results:
docs/results/speculative_main/README.md.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="main_job_speculative",
      config="configs/jobs/main.py",
      variants=independent([("plain", {}), ("ngram", {"rollout.draft": "ngram"})]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "wall_time_s"),
      baseline="plain",
      description="Speculative decoding (prompt lookup) trains the main job to the same "
                  "held-out accuracy as plain sampling.")

"""A one-run study that trains long enough to be stopped while its verifier workers run (the
smoke study's tiny model, many steps)."""
from rljax.sweep.study import Study, independent
from tests.sweep.smoke_study import TINY


def get_study():
  return Study(
      name="stop",
      config="configs/algos/grpo.py",
      overrides=dict(TINY, **{"train.steps": 100000, "reward.workers": 2}),
      variants=independent([("only", {})]),
      seeds=(0,),
      metrics=("final_accuracy",),
      baseline="only",
      description="Stopped by a signal in the tests.")

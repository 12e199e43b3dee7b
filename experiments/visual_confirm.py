"""The confirmation of `experiments/visual_seeds.py`'s gain, fixed before it ran: five fresh seeds
(10-14) of `configs/tasks/visual.py` from the same SFT cold start, read as they come (no seed added
or dropped after a look). Ten seeds there gave +3.3 points [+1.6, +5.0] after five had been
inconclusive (optional stopping); this study alone answers the issue's five-seed question.

  python -m rljax sweep experiments/visual_confirm.py --root /tmp/visual --parallel 1
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="visual_confirm",
      config="configs/tasks/visual.py",
      variants=independent([("grpo", {})]),
      seeds=tuple(range(10, 15)),
      metrics=("final_accuracy", "gain_accuracy", "best_accuracy", "wall_time_s"),
      baseline="grpo",
      description="Five fresh seeds, fixed in advance: does GRPO raise the held-out accuracy of "
                  "the visual task's policy over its SFT cold start?")

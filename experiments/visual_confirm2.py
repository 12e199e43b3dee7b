"""The visual task's GRPO gain with the recipe the pilot chose (`experiments/visual_pilot.py`: 32
prompts a step, 512 held-out images), fixed before it ran: five fresh seeds (20-24) of
`configs/tasks/visual.py` from its SFT cold start, read as they come (no seed added or dropped
after a look). The interval of this study alone answers the five-seed question.

  python -m rljax sweep experiments/visual_confirm2.py --root /tmp/visual --parallel 2
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="visual_confirm2",
      config="configs/tasks/visual.py",
      variants=independent([("grpo", {})]),
      seeds=tuple(range(20, 25)),
      metrics=("final_accuracy", "gain_accuracy", "best_accuracy", "wall_time_s"),
      baseline="grpo",
      description="Five fresh seeds, fixed in advance: does GRPO at 32 prompts a step raise the "
                  "held-out accuracy of the visual task's policy over its SFT cold start?")

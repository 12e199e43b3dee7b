"""`configs/tasks/visual.py` (sums read from images by a tiny Qwen2.5-VL) over ten seeds from one
SFT cold start: held-out exact accuracy before (the cold start) and after GRPO, the gain as a mean
with a 95% t-interval (docs/results/visual/).

  python -m rljax sweep experiments/visual_seeds.py --root /tmp/visual --parallel 2

The seeds are RL runs (``seed``: sampling; ``data.train_seed``: the order of training images) from
the cold start of ``sft.seed``; the held-out images (``data.eval_seed``) are the same for every run.
Seeds 0-4 first (inconclusive: +1.9 points [-0.3, +4.0]), 5-9 added after; ``--seeds 0,1,2,3,4``
runs the first five only.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="visual_seeds",
      config="configs/tasks/visual.py",
      variants=independent([("grpo", {})]),
      seeds=tuple(range(10)),
      metrics=("final_accuracy", "gain_accuracy", "best_accuracy", "wall_time_s"),
      baseline="grpo",
      description="Does GRPO raise the held-out accuracy of the visual task's policy over its SFT "
                  "cold start?")

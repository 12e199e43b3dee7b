"""The main job (configs/jobs/main.py) over five seeds: its held-out accuracy as a mean with a 95%
interval, the figure the README quotes. The seeds are RL runs (sampling, prompt order) from one
SFT cold start, the one of ``sft.seed``, as the field's runs start from one pretrained model.

  python -m rljax sweep experiments/main_job_seeds.py --root runs/main_seeds

float32 rounding differs between CPUs (and with the thread count), so a seed's curve is
reproduced to every digit only on the machine that ran it; the interval is what transfers.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="main_job_seeds",
      config="configs/jobs/main.py",
      variants=independent([("dapo", {})]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "best_accuracy", "wall_time_s"),
      baseline="dapo",
      description="The main job over five seeds.")

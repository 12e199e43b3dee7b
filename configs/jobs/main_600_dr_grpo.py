"""The former 600-step main job with Dr. GRPO instead of DAPO: same task, SFT start, model,
rollout, optimizer and update schedule.

  python -m rljax train --config configs/jobs/main_600_dr_grpo.py

configs/jobs/main_600_grpo.py with the ``algo`` and ``reward`` sections of
configs/algos/dr_grpo.py (no std normalisation, constant length normaliser, no KL, no overlong
shaping, no dynamic sampling).
"""
from rljax.config.loader import based_on, swap_algorithm


def get_config():
  c = swap_algorithm(based_on("jobs/main_600_grpo.py"), "algos/dr_grpo.py")
  c.train.run_dir = "runs/main_dr_grpo"
  return c

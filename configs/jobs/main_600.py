"""The main job as it ran until 2026-12-02: DAPO for 600 steps (16 prompts x 8, lr 3e-5) from
a cold start trained to 40% exact match; configs/jobs/main.py with those five values. The studies
recorded on it keep it, so that they reproduce: configs/jobs/main_600_grpo.py and
main_600_dr_grpo.py, experiments/compare_main.py, async_main.py, opd_demo.py and
studies/lora_without_regret.py, and the benchmarks that describe its runs.
docs/results/main_job/README.md says what changed and why.

  python -m rljax train --config configs/jobs/main_600.py
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("jobs/main.py")
  c.rollout.prompts_per_step = 16
  c.rollout.group_size = 8
  c.optim.lr = 3e-5
  c.train.steps = 600
  c.sft.stop_match = 0.4
  c.train.run_dir = "runs/main_600"
  c.sft.out_dir = "runs/sft_600"
  return c

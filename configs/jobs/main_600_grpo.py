"""The former 600-step main job with GRPO instead of DAPO: same task, SFT start, model, rollout,
optimizer and update schedule.

  python -m rljax train --config configs/jobs/main_600_grpo.py

configs/jobs/main_600.py with the ``algo`` and ``reward`` sections of configs/algos/grpo.py (group
z-score advantages, symmetric clip 0.2, sequence-mean loss, k3 KL to the frozen SFT policy, no
overlong shaping, no dynamic sampling); the update schedule (epochs, minibatches) stays the job's.
The SFT cold start in ``sft.out_dir`` is shared with main_600.py. It varies the 600-step job, not
configs/jobs/main.py, because the studies recorded on it ran there
(docs/results/main_600_algorithms/, docs/results/rlhf/).
"""
from rljax.config.loader import based_on, swap_algorithm


def get_config():
  c = swap_algorithm(based_on("jobs/main_600.py"), "algos/grpo.py")
  c.train.run_dir = "runs/main_grpo"
  # 256 held-out problems, as when the studies on this job ran (rlhf_overoptimization, the
  # comparison of docs/results/main_600_algorithms/README.md); the main job now evaluates all 943.
  c.data.num_eval = 256
  return c

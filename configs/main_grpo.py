"""The main job with GRPO instead of DAPO: same task, SFT start, model, rollout and optimizer.

  python -m rljax train --config configs/main_grpo.py

configs/main_600.py with the ``algo`` and ``reward`` sections of configs/grpo.py (group z-score
advantages, symmetric clip 0.2, sequence-mean loss, k3 KL to the frozen SFT policy, no overlong
shaping, no dynamic sampling); the update schedule (epochs, minibatches) stays main_600.py's.
The SFT cold start in ``sft.out_dir`` is shared with main_600.py.
"""
import os

from rljax.config.loader import load_config_file, preset

_HERE = os.path.dirname(os.path.abspath(__file__))
# The update schedule is main_600.py's (the same RL hyperparameters), only the algorithm differs.
_KEEP_FROM_MAIN = {("algo", "epochs"), ("algo", "minibatches"), ("algo", "micro_batches")}


def with_algorithm(algo_file: str, run_dir: str):
  """configs/main_600.py with the algo and reward sections of ``algo_file`` (a preset beside it)."""
  c = preset(__file__, "main_600.py")
  algo = load_config_file(os.path.join(_HERE, algo_file))
  for section in ("algo", "reward"):
    for key, value in algo[section].items():
      if (section, key) not in _KEEP_FROM_MAIN:
        c[section][key] = value
  c.train.run_dir = run_dir
  # 256 held-out problems, as when the studies on this base ran (rlhf_overoptimization, the
  # comparisons of docs/results/main_600_algorithms/README.md); the main job now evaluates all 943.
  c.data.num_eval = 256
  return c


def get_config():
  return with_algorithm("grpo.py", "runs/main_grpo")

"""The main job with Dr. GRPO instead of DAPO: same task, SFT start, model, rollout and optimizer.

  python -m rljax train --config configs/main_dr_grpo.py

configs/main_600.py with the ``algo`` and ``reward`` sections of configs/dr_grpo.py (no std
normalisation, constant length normaliser, no KL, no overlong shaping, no dynamic sampling).
"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "rljax_config_main_grpo", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           "main_grpo.py"))
_main_grpo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_main_grpo)


def get_config():
  return _main_grpo.with_algorithm("dr_grpo.py", "runs/main_dr_grpo")

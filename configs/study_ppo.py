"""Study scale with PPO (a critic, GAE): configs/study.py's task, model and schedule with the
``algo``, ``critic`` and ``reward`` sections of configs/ppo.py; the base of the VC-PPO / VAPO
ladder (experiments/studies/vapo_ladder.py).
"""
import os

from rljax.config.loader import load_config_file, preset

_HERE = os.path.dirname(os.path.abspath(__file__))
# The update schedule is study.py's: only the algorithm differs.
_KEEP_FROM_STUDY = {("algo", "epochs"), ("algo", "minibatches"), ("algo", "micro_batches")}


def get_config():
  c = preset(__file__, "study.py")
  ppo = load_config_file(os.path.join(_HERE, "ppo.py"))
  for section in ("algo", "critic", "reward"):
    for key, value in ppo[section].items():
      if (section, key) not in _KEEP_FROM_STUDY:
        c[section][key] = value
  # The critic learns faster than the policy (ORZ: 5x), from a fresh value head.
  c.critic.lr = 5 * c.optim.lr
  c.train.run_dir = "runs/study_ppo"
  return c

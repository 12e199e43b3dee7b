"""The former study scale with PPO (a critic, GAE): configs/studies/arith_l1_grpo.py's task, model
and update schedule with the ``algo``, ``critic`` and ``reward`` sections of configs/algos/ppo.py;
the base of the VC-PPO / VAPO ladder (experiments/studies/vapo_ladder.py).
"""
from rljax.config.loader import based_on, swap_algorithm


def get_config():
  c = swap_algorithm(based_on("studies/arith_l1_grpo.py"), "algos/ppo.py",
                     sections=("algo", "critic", "reward"))
  # The critic learns faster than the policy (ORZ: 5x), from a fresh value head.
  c.critic.lr = 5 * c.optim.lr
  c.train.run_dir = "runs/study_ppo"
  return c

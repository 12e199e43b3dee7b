"""`configs/tasks/agent_calc.py` (the calculator agent, ordinary OpenAI-client code, trained through the
endpoint) over five seeds from one cold start: held-out pass@1 before (the SFT cold start) and
after RL, means with 95% intervals; `experiments/tool_calc_seeds.py` is the same task played by
the in-process environment (the baseline).

  python -m rljax sweep experiments/agent_calc_seeds.py --root runs/agents --parallel 2
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="agent_calc_seeds",
      config="configs/tasks/agent_calc.py",
      variants=independent([("rl", {})]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_accuracy", "gain_accuracy", "wall_time_s"),
      baseline="rl",
      description="Does GRPO through the OpenAI-compatible endpoint raise the calculator agent's "
                  "held-out pass@1 over the cold start?")

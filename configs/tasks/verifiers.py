"""GRPO on an environment of the ``verifiers`` library, from one command, with no download.

  pip install 'rljax[verifiers]'
  python -m rljax train --config configs/tasks/verifiers.py

The environment is a ``vf.SingleTurnEnv`` written as the library's documentation writes one
(``rljax/envs/verifiers_demo.py``: a generated dataset of sums and products, ``'7+35='`` ->
``'#42'``, and a ``vf.Rubric`` rewarding the right answer, plus a small weight for an integer
answer); ``data.source='verifiers:MODULE:FUNCTION'`` builds it, its dataset gives the prompts
(about a tenth held out for evaluation) and ``env.name='verifiers'`` runs every completion through
the library's own episode and rubric code in rljax's environment workers
(``rljax/envs/verifiers_env.py``, docs/integrations.md). The tool environment of the same module,
a ``vf.ToolEnv`` with a calculator, runs with

  --config.data.source=verifiers:rljax.envs.verifiers_demo:load_calc_environment
  --config.env.max_turns=3 --config.env.max_tokens=48

The policy is a fresh tiny character-level model (no cold start: the rows have no reference
solutions), so the format term is what it learns first. ``--config.train.steps=2`` for a smoke
run.
"""
import json

from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.data.source = "verifiers:rljax.envs.verifiers_demo:load_arith_environment"
  c.data.verifiers.args = json.dumps({"num_examples": 2000})
  c.data.prompt_bucket = 8
  c.data.num_eval = 64
  c.env.name = "verifiers"
  c.env.max_turns = 1
  c.env.max_tokens = 8  # '#9801' and EOS
  c.env.timeout_s = 10.0
  c.rollout.max_new_tokens = 8
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"  # no reference model: one forward less per step
  c.optim.lr = 3e-4
  c.optim.warmup_steps = 2
  c.train.steps = 50
  c.train.eval_every = 25
  c.train.run_dir = "runs/verifiers"
  return c

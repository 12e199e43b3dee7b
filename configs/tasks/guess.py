"""Multi-turn RL that shortens episodes: find a hidden number in [1, 16] from higher / lower.

  python -m rljax train --config configs/tasks/guess.py

Every turn is a ``<guess n>`` call answered ``' higher'`` or ``' lower'`` by the ``guess``
environment; finding the number at turn t of at most K = env.max_turns earns (K + 1 - t) / K.
The SFT cold start (``sft``) learns from reference episodes of which 30% bisect and the rest
guess uniformly among the numbers still possible; GRPO then cuts the mean number of turns.
Measured figures: docs/multiturn.md. ``--config.train.steps=2`` for a smoke run.
"""
import rljax.envs  # noqa: F401  (registers the environments and their embedded tasks)
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "sft"
  c.data.source = "embedded:guess"
  c.data.difficulty = 0  # N = 16
  c.data.prompt_bucket = 16
  c.data.num_eval = 64  # every number 4 times
  c.env.name = "guess"
  c.env.max_turns = 5  # bisection needs at most 5
  c.env.max_tokens = 96  # five guesses and four replies take at most 82 tokens
  c.env.tool_format = "compact"
  # Per turn; the SFT cold start's examples are data.prompt_bucket + this wide (its longest
  # reference episode, 83 tokens with EOS, fits).
  c.rollout.max_new_tokens = 88
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"  # no reference model: one forward less per step
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 2
  c.train.steps = 40
  c.train.eval_every = 20
  c.train.run_dir = "runs/guess"
  c.sft.steps = 400
  c.sft.batch_size = 32  # examples are 104 tokens wide (tool_calc's 40)
  c.sft.out_dir = "runs/sft_guess"
  return c

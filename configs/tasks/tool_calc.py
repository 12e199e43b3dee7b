"""Multi-turn RL with a calculator tool: 3-digit x 2-digit products on a 2-core CPU in minutes.

  python -m rljax train --config configs/tasks/tool_calc.py

A ~1M-parameter character-level Llama cannot multiply 123*45 in its head, but it can copy the
factors into a calculator call and copy the result out. The SFT cold start (``sft``, stopped
when its samples reproduce a reference 10% of the time) sees reference solutions of the
``tool_calc`` task that use the calculator in 30% of the problems (``'<calc 123*45>5535 #5535'``)
and answer directly otherwise (``' #5535'``); GRPO in the
``tool_calc`` environment (``env.*``: each call answered by the calculator as an observation,
the final answer scored) then raises held-out accuracy by making it call the tool. Measured
figures: docs/multiturn.md. ``--config.train.steps=2`` for a smoke run.
"""
import rljax.envs  # noqa: F401  (registers the environments and their embedded tasks)
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "sft"
  c.data.source = "embedded:tool_calc"
  c.data.difficulty = 0  # '123*45='
  c.data.prompt_bucket = 8
  c.data.num_eval = 128
  c.env.name = "tool_calc"
  c.env.max_turns = 3
  c.env.max_tokens = 48  # the longest reference episode is 25 tokens
  c.env.tool_format = "compact"
  # Per turn; the SFT cold start's examples are data.prompt_bucket + this wide (its longest
  # reference solution, 25 tokens with EOS, fits).
  c.rollout.max_new_tokens = 32
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"  # no reference model: one forward less per step
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 2
  c.train.steps = 100
  c.train.eval_every = 50
  c.train.run_dir = "runs/tool_calc"
  # GRPO learns only from groups with a rewarded sample, and the cold start's reward comes from
  # the calls that copy the factors right, a skill that appears after a number of steps that
  # varies with sft.seed (600 fixed steps: 0.0-0.x% of sampled episodes rewarded for one cold
  # start, enough for others; docs/results/agents/README.md). So SFT stops when sampling at
  # temperature 1 writes a reference solution 10% of the time (at the start of RL about 1 group
  # in 2 holds a rewarded sample), whichever step that takes; sft.steps is only the bound.
  c.sft.steps = 3000
  c.sft.stop_on = "sampled"
  c.sft.stop_match = 0.1
  c.sft.check_every = 25
  c.sft.check_size = 512
  c.sft.out_dir = "runs/sft_tool_calc"
  return c

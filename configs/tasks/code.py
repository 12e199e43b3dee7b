"""Coding RL: programs written by the policy, checked against each task's unit tests in the
sandbox (rljax/agents/sandbox.py: no network, CPU / memory / process / file / output limits).

  python -m rljax train --config configs/tasks/code.py \\
      --config.model.source=hf:PATH --config.data.tokenizer=PATH

``data.source='code:PATH'`` reads MBPP- or HumanEval-style JSONL rows (rljax/data/code_tasks.py);
``configs/data/code_tasks.jsonl`` is a small embedded set of both layouts. ``reward.fn=
'code_tests'`` is the fraction of a task's tests the completion's program passes (correct: all;
``'code_tests_all'``: 1 or 0). ``PATH``: a local instruct model that writes Python (Qwen2.5-0.5B-
Instruct or larger); nothing is downloaded. docs/agents.md.
"""
import rljax.agents  # noqa: F401  (registers the code reward functions)
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "hf:models/Qwen2.5-0.5B-Instruct"
  c.data.tokenizer = "models/Qwen2.5-0.5B-Instruct"
  c.data.chat_template = True
  c.data.source = "code:configs/data/code_tasks.jsonl"
  c.data.prompt_bucket = 64
  c.reward.fn = "code_tests"
  c.reward.timeout_s = 30.0  # the sandbox's own wall clock (20 s) plus its start
  c.rollout.max_new_tokens = 384
  c.rollout.prompts_per_step = 4
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"
  c.optim.lr = 1e-6
  c.train.steps = 50
  c.train.eval_every = 25
  c.train.run_dir = "runs/code"
  return c

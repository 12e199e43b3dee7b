"""The main job: DAPO on embedded arithmetic from an SFT cold start, on a 2-core CPU in minutes.

  python -m rljax train --config configs/main.py

A ~1M-parameter character-level Llama first learns the answer format from reference solutions
(``sft``), then DAPO improves its held-out accuracy. ``--config.train.steps=3`` for a smoke run.
"""
from rljax.config_loader import preset


def get_config():
  c = preset(__file__, "dapo.py")
  c.model.source = "sft"
  c.data.source = "embedded:arithmetic"
  c.data.difficulty = 1
  c.data.prompt_bucket = 8
  c.data.num_eval = 256
  c.rollout.max_new_tokens = 24
  c.rollout.prompts_per_step = 16
  c.rollout.group_size = 8
  c.reward.overlong_buffer = 4
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 5
  c.algo.minibatches = 2
  c.train.steps = 60
  c.train.eval_every = 20
  c.train.run_dir = "runs/main"
  c.sft.steps = 300
  c.sft.out_dir = "runs/sft"
  return c

"""The former study scale (until 2026-11-28): the base of the six studies of
docs/results/level1_studies/README.md.

  python -m rljax sweep experiments/studies/dapo_ladder.py

GRPO on embedded arithmetic level 1 from a short SFT cold start, small enough that one run takes
a few minutes on a 2-core CPU, so that a study (variants x seeds) fits in under an hour.

Why this task: level 1 has four operands and parentheses, so a solution is three steps whose
length depends on the numbers (reference solutions 17-32 characters, mean 24.5, p95 30). With
``rollout.max_new_tokens = 28`` the longest correct solutions and every rambling wrong one are
cut off, so truncation, overlong shaping and length-normalised losses all act on a real fraction
of the completions. The sweep tool trains its cold start once (``sft.out_dir``), from ``sft.seed``,
and every seed of a study starts from it.

Studies start from this file (GRPO) or from ``configs/studies/arith_l1_ppo.py`` (PPO with a
critic) and change only the algorithm keys of their variants.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "sft"
  c.data.source = "embedded:arithmetic"
  c.data.difficulty = 1
  c.data.prompt_bucket = 16  # SFT width = bucket + max_new_tokens must hold the 33-token solutions
  c.data.num_eval = 256  # 128 gave evals that moved +-5 points between neighbouring evals
  c.rollout.max_new_tokens = 28
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.rollout.temperature = 1.0
  c.optim.lr = 3e-5
  c.optim.warmup_steps = 5
  c.optim.max_grad_norm = 1.0
  c.algo.minibatches = 4  # the main job's schedule (configs/jobs/main.py): 4 updates a step
  c.algo.epochs = 1
  c.train.steps = 100
  c.train.eval_every = 25
  c.train.checkpoint_every = 50
  c.train.keep_checkpoints = 1
  c.train.export_hf = False
  c.train.progress = False
  c.train.run_dir = "runs/study"
  c.sft.steps = 600
  c.sft.out_dir = "runs/studies/_sft/default"
  return c

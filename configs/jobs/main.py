"""The main job: DAPO on embedded arithmetic from an SFT cold start, on a 2-core CPU in minutes.

  python -m rljax train --config configs/jobs/main.py

A ~1M-parameter character-level Llama first learns the answer format from reference solutions
(``sft``), then DAPO improves its held-out greedy accuracy. Measured accuracy and wall time, and
how the settings below were chosen: docs/results/main_job/README.md and
docs/results/main_600_algorithms/README.md. ``--config.train.steps=3`` for a smoke run.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/dapo.py")
  c.model.source = "sft"
  c.data.source = "embedded:arithmetic"
  # Level 0: three single-digit operands, + - *, no parentheses (e.g. '7+8*2=' ->
  # '8*2=16,7+16=23 #23'); reference solutions are at most 20 characters. (Level 1 has four
  # operands and parentheses, solutions up to 32 characters: it would not fit 24 new tokens.)
  c.data.difficulty = 0
  c.data.prompt_bucket = 8
  # Every held-out problem of level 0 (943; the hash split holds out 10% of the problem space):
  # 256 of them left a gain's eval noise at ~3 points
  # (docs/results/main_job/archive/2026-11-28-all-heldout.md).
  c.data.num_eval = 943
  c.rollout.max_new_tokens = 24
  # More prompts with fewer completions each learn more per step (32 x 4 against 16 x 8 and
  # 8 x 16, the same 128 completions: docs/results/claims/archive/2026-12-02-main-job-200.md), at
  # more dynamic-sampling rounds a step: with 4 completions more groups come back all correct.
  c.rollout.prompts_per_step = 32
  c.rollout.group_size = 4
  c.rollout.temperature = 1.0
  # Soft overlong punishment from 22 tokens on: the longest reference solution is 20 characters
  # plus EOS (21 tokens), so a correct answer is never penalised.
  c.reward.overlong_buffer = 3
  # exact_match is our own bounded string check: run in the trainer's process, it skips a process
  # round trip per completion (~12 ms of each ~65 ms sampling round here).
  c.reward.workers = 0
  # From the 30% cold start at 32 x 4 a larger step learns more in 200 steps: 3e-5, 5e-5, 7e-5
  # on one core (docs/results/claims/archive/2026-12-02-main-job-200.md), 7e-5 and 1e-4 over five
  # seeds (docs/results/main_job/archive/2026-12-02-200-steps.md), where the weakest seed gained
  # +10.8 and +17.7. (From the 40% cold start at 16 x 8, steps above 3e-5 had learned slower:
  # docs/results/main_600_algorithms/README.md.)
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 5
  c.optim.max_grad_norm = 1.0
  c.algo.minibatches = 4
  c.algo.epochs = 1
  # The PPO ratio's old log-probs are the sampler's (float32, the same weights: equal to a
  # recomputing forward within rounding), which saves that forward: ~0.82x the update's time.
  c.algo.old_logp = "sampler"
  c.train.steps = 200
  c.train.eval_every = 50
  c.train.run_dir = "runs/main"
  # SFT until greedy decoding writes 30% of held-aside train problems exactly (checked every 10
  # steps, at most 600): a fixed 250 steps left the seeds anywhere between 18% and 55%, and the
  # one at 18% barely learned in RL
  # (docs/results/main_job/archive/2026-11-26-three-seeds-timed-runs.md); from 30% RL gained more
  # in 200 steps than from 40%, on four seeds of five, with half the spread
  # (docs/results/claims/archive/2026-11-28-main-600-first-200.md).
  c.sft.steps = 600
  c.sft.stop_match = 0.3
  c.sft.check_every = 10
  c.sft.out_dir = "runs/sft"
  return c

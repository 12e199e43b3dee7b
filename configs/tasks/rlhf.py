"""RLHF on an embedded task, with reward over-optimisation in view (docs/reward_models.md).

``python -m rljax train --config configs/tasks/rlhf.py`` runs, from nothing on disk:

1. the SFT cold start of a tiny policy on the arithmetic task's worked solutions (``sft.*``);
2. the hidden gold scorer (``rljax.rewards.gold``: correct, minus 0.02 per token) labels
   ``reward.gold.pairs`` preference pairs into ``rm.train_file``, and ``rljax rm`` trains a
   reward model on them, starting from the SFT policy (``rm.*``; ``runs/rlhf/rm``);
3. GRPO against that reward model (``reward.sources``: ``rm`` weight 1) with the gold score
   logged, not optimised (``gold`` weight 0; the verifier, weight 0, logs accuracy), and the KL
   from the initial policy logged (``kl``: the frozen reference is the SFT start).

Steps 1 and 2 are kept on disk and reused by the next run. The run writes ``reward/rm`` (the
proxy), ``reward/gold`` and ``kl`` per step to ``metrics.jsonl`` and draws each against the KL
in ``rewards_vs_kl.png``. Everything is tiny: minutes on a CPU. The study over seeds and KL
coefficients is ``experiments/studies/rlhf_overoptimization.py``.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.data.source = "embedded:arithmetic"
  c.data.difficulty = 0
  c.data.num_eval = 64
  c.data.prompt_bucket = 16
  c.model.source = "sft"
  c.model.hidden_size = 64
  c.model.intermediate_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.num_kv_heads = 1
  c.sft.steps = 1500  # 58% held-out accuracy at level 0 (300 steps: 11%, too few right to lose)
  c.sft.batch_size = 32
  c.sft.warmup_steps = 20
  c.sft.out_dir = "runs/rlhf/sft"
  # The reward: the learned proxy, with the gold score and the verifier logged only.
  c.reward.sources = "rm:1.0,gold:0.0,verifier:0.0"
  c.reward.model.source = "run:runs/rlhf/rm"
  c.reward.gold.pairs = 2000
  c.rm.train_file = "runs/rlhf/pairs.jsonl"
  c.rm.steps = 200
  c.rm.batch_size = 16
  c.rm.max_tokens = 48
  c.rm.eval_every = 100
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.rollout.max_new_tokens = 24
  c.optim.lr = 2e-4
  c.algo.kl_coef = 0.01
  c.train.steps = 40
  c.train.run_dir = "runs/rlhf/grpo"
  c.train.loggers = ("jsonl",)
  return c

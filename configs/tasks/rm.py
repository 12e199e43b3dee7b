"""A scalar reward model trained on preference pairs: ``rljax rm --config configs/tasks/rm.py
--config.rm.train_file=PAIRS.jsonl`` (docs/reward_models.md).

Bradley-Terry loss on ``{"prompt", "chosen", "rejected"}`` lines, 10% of them held out for the
pairwise accuracy; a tiny model from scratch on the char tokenizer (``model.source`` takes any
policy source: ``hf:PATH`` of the policy's base is the usual start). The run directory's export
``runs/rm/hf`` is what ``reward.model.source='run:runs/rm'`` scores with.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on()
  c.model.hidden_size = 64
  c.model.intermediate_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.num_kv_heads = 1
  c.rm.steps = 300
  c.rm.batch_size = 16
  c.rm.max_tokens = 64
  c.rm.eval_every = 50
  c.optim.lr = 1e-3
  c.optim.warmup_steps = 20
  c.optim.schedule = "cosine"
  c.train.run_dir = "runs/rm"
  c.train.loggers = ("jsonl",)
  return c

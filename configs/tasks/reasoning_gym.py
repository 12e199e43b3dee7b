"""DAPO on a reasoning-gym task (chain_sum, near its easiest settings) from an SFT cold start, on a
CPU.

  pip install 'rljax[reasoning_gym]'
  python -m rljax train --config configs/tasks/reasoning_gym.py

reasoning-gym's ``chain_sum`` with two or three one-digit terms (e.g. ``'7 - 2 + 5='`` ->
``'#10'``), its answers scored by the task's own ``score_answer`` (``reward.fn='reasoning_gym'``).
The prompt is the bare expression (``data.reasoning_gym.template``): the library's question text
has capitals, which the character vocabulary does not hold; with a Hugging Face tokenizer use the
default ``'{question}'`` and ``data.chat_template=True``. A short SFT cold start teaches the
``'#answer'`` format from the reference answers, then DAPO trains on the task's reward. Held-out
accuracy over five seeds (``experiments/reasoning_gym_seeds.py``):
docs/results/reasoning_gym/README.md. ``--config.train.steps=3`` for a smoke run.
"""
import json

from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/dapo.py")
  c.model.source = "sft"
  c.data.source = "reasoning_gym:chain_sum"
  # 4,200 distinct problems (10**2 x 2 + 10**3 x 4 sign patterns); the generator's items are
  # indexed within `size`, so it is larger than that.
  c.data.reasoning_gym.config = json.dumps({"chain_sum": {
      "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1, "size": 20000}})
  c.data.reasoning_gym.template = "{expression}="
  c.reward.fn = "reasoning_gym"
  c.data.prompt_bucket = 16
  c.data.num_eval = 256  # 128 left +-4 points of eval noise on gains of ~10
  c.rollout.max_new_tokens = 8  # '#-18' and EOS: at most 5 tokens
  c.rollout.prompts_per_step = 16
  c.rollout.group_size = 8
  c.rollout.temperature = 1.0
  # Soft overlong punishment from 7 tokens on: the longest reference answer with EOS is 5 tokens.
  c.reward.overlong_buffer = 2
  c.optim.lr = 3e-5
  c.optim.warmup_steps = 5
  c.optim.max_grad_norm = 1.0
  c.algo.minibatches = 4
  c.algo.epochs = 1
  c.train.steps = 400
  c.train.eval_every = 50
  c.train.run_dir = "runs/reasoning_gym"
  # SFT until greedy decoding writes 35% of held-aside train problems exactly (at most 600
  # steps): a fixed 100 steps left the seeds at 7-15% held-out, where 200 RL steps moved them
  # within the noise (docs/results/reasoning_gym/README.md). chain_sum has 4,200 distinct problems,
  # so the check's train problems were mostly seen in SFT: held-out accuracy starts lower (~23%).
  c.sft.steps = 600
  c.sft.stop_match = 0.35
  c.sft.check_every = 10
  c.sft.out_dir = "runs/sft_reasoning_gym"
  return c

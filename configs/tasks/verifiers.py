"""GRPO on a verifiers v1 environment (``verifiers>=0.4``: a taskset played by the library's own
harness), through the OpenAI-compatible endpoint, from one command, with no download.

  scripts/bootstrap.sh          # makes .venv-verifiers: verifiers 0.4.0 and uv
  python -m rljax train --config configs/tasks/verifiers.py

The environment is ``reverse_letters`` (``configs/verifiers_v1/reverse_letters``), a v1 taskset
written as the library's example ``reverse_text``: reverse a short lowercase string, rewarded by
the ``difflib`` ratio of the reply against the reversal. The library runs it in its own Python
(``.venv-verifiers``) behind rljax's bridge, and its ``null`` harness (a chat program, a ``uv``
script) makes each episode's chat call to the run's endpoint; the trainer records the exact ids
it served and GRPO trains on the rubric's reward (``env.name='vf1_reverse_letters'``,
``rljax/agents/verifiers_v1_demo.py``; docs/agents.md). The rows are the taskset's own
(``configs/data/reverse_letters.jsonl``).

The policy is a fresh tiny model over a character-level tokenizer with a ChatML chat template
(``configs/tokenizers/chatml_chars``, written by scripts/make_chat_tokenizer.py): the library
sends chat messages. No cold start: the reward is dense, so a random policy's groups already
differ. ``--config.train.steps=2`` for a smoke run.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "tiny"
  c.data.tokenizer = "configs/tokenizers/chatml_chars"
  c.data.chat_template = True
  c.data.source = "jsonl:configs/data/reverse_letters.jsonl"
  # The first prompt as the library sends it (system and user messages in ChatML, 51-54 ids):
  # it sizes the engine's cache store with env.max_tokens.
  c.data.max_prompt_tokens = 64
  c.data.prompt_bucket = 64
  c.data.num_eval = 32
  c.env.name = "vf1_reverse_letters"
  c.env.engine = "endpoint"
  c.env.max_turns = 1  # the taskset stops after one reply
  c.env.max_tokens = 16
  # A whole episode, the first batches' compilations of the engine's lanes and the first start
  # of the harness's uv script included (minutes on a loaded 2-core CPU).
  c.env.timeout_s = 1200.0
  c.rollout.max_new_tokens = 8  # 'fedcba' and <|im_end|>
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"  # no reference model: one forward less per step
  # 3e-4 barely moved a fresh policy in 31 steps (mean reward 0.05 -> 0.07), 2e-3 more
  # (docs/results/agents/verifiers_preset.md).
  c.optim.lr = 2e-3
  c.optim.warmup_steps = 2
  c.train.steps = 50
  c.train.eval_every = 25
  c.train.run_dir = "runs/verifiers"
  return c

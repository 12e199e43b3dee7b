"""TRL's ``GRPOTrainer`` as a peer of ``benchmarks/train_step.py``, offline, on a random tiny Llama.

The policy (a random ``LlamaForCausalLM`` with the benchmark's sizes) and a word-level tokenizer
over the same 48 ids (``t3`` .. ``t47`` plus pad/eos/bos) are written to a temporary directory,
which ``GRPOTrainer`` loads the policy and its reference model from. The dataset holds prompts of
``PROMPT_LEN`` random tokens; the reward function returns random 0/1 rewards. Settings matching
the rljax side: ``num_generations = GROUP``, one optimizer step per generation batch of
``PROMPTS x GROUP`` completions, ``beta = 0.04`` (k3 KL in the loss), ``loss_type='grpo'``
(sequence mean of token means), clip 0.2, group z-score rewards, temperature 1 without top-k /
top-p, exactly ``new_tokens`` sampled tokens (``min_new_tokens``), float32 on the CPU, AdamW with
lr 1e-6 and gradient clipping at 1, and no gradient checkpointing (TRL turns it on by default;
rljax's ``model.remat`` is 'none').

Phases (seconds per optimizer step), from wrappers around the trainer's own methods:
``rollout`` = ``GRPOTrainer._generate`` (prompt tokenisation, ``generate``, completion decoding);
``scoring`` = the rest of ``_generate_and_score_completions`` (rewards, the reference model's
forward, advantages, metrics); ``train`` = the rest of the step from ``on_step_begin`` to
``on_step_end`` (the policy's forward and backward in ``compute_loss``, clipping, AdamW, the
trainer's bookkeeping); ``update = scoring + train``.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np


def _tokenizer(vocab: int):
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  words = {"<pad>": 0, "</s>": 1, "<s>": 2}
  words.update({f"t{i}": i for i in range(3, vocab)})
  tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                 bos_token="<s>", unk_token="<pad>", padding_side="left")


class TrlPeer:
  """``step(i) -> {phase: seconds}``: one ``GRPOTrainer`` optimizer step per call."""

  def __init__(self, hf_config, *, new_tokens: int, prompts: int, group: int, prompt_len: int,
               vocab: int, steps: int, between_steps=None):
    """``between_steps(i)``: called after each timed step, outside its clock (the other sides'
    steps, so that all sides see the same machine load)."""
    import datasets
    import torch
    import transformers
    import trl
    self._dir = tempfile.TemporaryDirectory(prefix="rljax_trl_peer_")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(hf_config).save_pretrained(self._dir.name)
    tokenizer = _tokenizer(vocab)
    tokenizer.save_pretrained(self._dir.name)
    rng = np.random.default_rng(0)
    rows = prompts * (steps + 2)
    texts = [" ".join(f"t{t}" for t in rng.integers(3, vocab, prompt_len)) for _ in range(rows)]
    args = trl.GRPOConfig(
        output_dir=os.path.join(self._dir.name, "out"), use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=prompts * group, gradient_accumulation_steps=1,
        num_generations=group, max_completion_length=new_tokens,
        generation_kwargs={"min_new_tokens": new_tokens}, temperature=1.0, top_k=0, top_p=1.0,
        beta=0.04, loss_type="grpo", epsilon=0.2, scale_rewards="group", learning_rate=1e-6,
        weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
        gradient_checkpointing=False,  # TRL's default is True; rljax's model.remat is 'none'
        max_steps=steps + 1, logging_steps=10 ** 6, save_strategy="no", report_to="none",
        disable_tqdm=True, seed=0, dataloader_num_workers=0, shuffle_dataset=False)
    reward_rng = np.random.default_rng(1)

    def random_reward(completions, **_):
      return [float(r) for r in reward_rng.integers(0, 2, len(completions))]

    self.trainer = trl.GRPOTrainer(model=self._dir.name, reward_funcs=random_reward, args=args,
                                   train_dataset=datasets.Dataset.from_dict({"prompt": texts}),
                                   processing_class=tokenizer)
    self.records: list[dict] = []
    self._wrap(between_steps or (lambda i: None))

  def _wrap(self, between_steps):
    import transformers
    trainer, current = self.trainer, {}

    def timed(name, fn):
      def run(*a, **kw):
        t = time.perf_counter()
        out = fn(*a, **kw)
        current[name] = current.get(name, 0.0) + time.perf_counter() - t
        return out
      return run

    trainer._generate = timed("rollout", trainer._generate)
    trainer._generate_and_score_completions = timed("generate_and_score",
                                                    trainer._generate_and_score_completions)
    records = self.records

    class Clock(transformers.TrainerCallback):
      def on_step_begin(self, *_, **__):
        current.clear()
        current["t0"] = time.perf_counter()

      def on_step_end(self, *_, **__):
        step = time.perf_counter() - current.pop("t0")
        gen_score = current.pop("generate_and_score")
        rollout = current.pop("rollout")
        records.append({"rollout": rollout, "scoring": gen_score - rollout,
                        "train": step - gen_score, "update": step - rollout, "step": step})
        between_steps(len(records) - 1)

    trainer.add_callback(Clock())
    trainer.remove_callback(transformers.PrinterCallback)  # the logs are not what is measured

  def run(self) -> list[dict]:
    """Trains ``steps + 1`` optimizer steps; the per-step phases, the first (warm-up) dropped."""
    self.trainer.train()
    self._dir.cleanup()
    return self.records[1:]

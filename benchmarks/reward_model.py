"""Cost of a learned reward model in the scoring phase: the composed reward of one batch
(``rljax.rewards.sources``) with the verifier alone against the verifier plus the reward model
(``reward.sources='verifier:1,rm:1'``), at the same batch, in one process.

The batch is the former main job's (configs/jobs/main_600.py): P x G = 16 x 8 = 128 rows of embedded
arithmetic, prompts of up to ``data.prompt_bucket`` chars, completions of up to 24 tokens (reference
solutions, wrong answers, garbage). The reward model has the main job's policy architecture
(the 'tiny' sizes: 4 layers, width 128), random weights saved as a ``*ForSequenceClassification``
directory. Two tokenizer paths: ``reuse`` (the reward model speaks the policy's char ids: they are
scored as they are) and ``re-encode`` (a byte-level BPE of its own: the text is encoded again).
Prints the median milliseconds per batch of each and what the reward model adds, also against
one jitted forward of the policy at the same rows (what the step's scoring spends per forward:
old or reference log-probs), measured in the same process.

  PYTHONPATH=. python benchmarks/reward_model.py [--repeats 20]
"""
import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from rljax.config import loader as config_loader
from rljax import models
from rljax.data import make_task
from rljax.data.tokenizer import CharTokenizer
from rljax.models import transformer
from rljax.models.config import tiny_config
from rljax.parallel import mesh as mesh_lib
from rljax.rewards import reward_model, sources  # noqa: F401 (reward_model registers 'rm')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS, GROUP, COMPLETION = 16, 8, 24


def main_config():
  return config_loader.load_config(os.path.join(ROOT, "configs", "jobs", "main_600.py"))


def batch(tok, seed: int = 0) -> sources.RewardBatch:
  """The main job's batch: 16 problems x 8 completions (a third right, a third wrong, a third
  garbage), left-padded prompts, right-padded completions with EOS where they ended."""
  rng = np.random.default_rng(seed)
  problems = make_task("arithmetic", 1).eval_set(seed, PROMPTS)
  rows = [p for p in problems for _ in range(GROUP)]
  texts = []
  for i, p in enumerate(rows):
    kind = i % 3
    text = p.solution if kind == 0 else f"#{int(p.answer) + 1}" if kind == 1 else \
        "".join(rng.choice(list("0123456789+-*= #"), int(rng.integers(1, COMPLETION))))
    texts.append(text[:COMPLETION - 1])
  prompt_ids = [tok.encode_prompt(p.prompt) for p in rows]
  width = max(map(len, prompt_ids))
  prompt_tokens = np.zeros((len(rows), width), np.int32)
  prompt_mask = np.zeros_like(prompt_tokens)
  tokens = np.zeros((len(rows), COMPLETION), np.int32)
  mask = np.zeros_like(tokens)
  for i, (ids, text) in enumerate(zip(prompt_ids, texts)):
    prompt_tokens[i, width - len(ids):], prompt_mask[i, width - len(ids):] = ids, 1
    out = tok.encode(text) + [tok.eos_id]
    tokens[i, :len(out)], mask[i, :len(out)] = out, 1
  return sources.RewardBatch(prompts=[p.prompt for p in rows], completions=texts,
                             problems=rows, prompt_tokens=prompt_tokens,
                             prompt_mask=prompt_mask, tokens=tokens, mask=mask)


def policy_forward_ms(rows: sources.RewardBatch, repeats: int) -> float:
  """One jitted forward (logits) of the main job's policy over the batch's prompt + completion
  rows: the yardstick of what a reward-model forward costs."""
  cfg = tiny_config(main_config().model, CharTokenizer().vocab_size)
  params = models.init_params(cfg, seed=0)
  tokens = np.concatenate([rows.prompt_tokens, rows.tokens], 1)
  mask = np.concatenate([rows.prompt_mask, rows.mask], 1)
  fn = jax.jit(lambda p, t, m: transformer.logits(cfg, p, t, m))
  return median_ms(lambda: fn(params, tokens, mask).block_until_ready(), repeats)


def reward_model_dir(root: str, vocab: int) -> str:
  """A random reward model of the main job's policy architecture, saved as a HF directory."""
  config = main_config()
  cfg = tiny_config(config.model, vocab, pad_token_id=0, eos_token_id=1)
  params = models.init_params(cfg, seed=0, head="score")
  path = os.path.join(root, f"rm_{vocab}")
  models.save_hf(path, cfg, params)
  return path


def bpe_tokenizer(path: str, texts) -> None:
  """A byte-level BPE of ~300 ids trained on the batch's text, saved beside the model."""
  from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  bpe = Tokenizer(tok_models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  bpe.train_from_iterator(list(texts) * 4, trainer)
  PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>",
                          bos_token="<bos>").save_pretrained(path)


def median_ms(fn, repeats: int) -> float:
  fn()  # compiles the reward model's forward, starts the verifier processes
  fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args(argv)
  tok = CharTokenizer()
  rows = batch(tok)
  mesh = mesh_lib.make_mesh(main_config().mesh)
  root = tempfile.mkdtemp()
  char_rm = reward_model_dir(root, 64)
  bpe_rm = reward_model_dir(root, 320)
  bpe_tokenizer(bpe_rm, list(rows.prompts) + list(rows.completions))
  cases = [("verifier alone", "", {}),
           ("verifier + rm (reuse ids)", "verifier:1,rm:1",
            {"source": f"hf:{char_rm}", "tokenizer": "char"}),
           ("verifier + rm (re-encode)", "verifier:1,rm:1", {"source": f"hf:{bpe_rm}"})]
  results = []
  for name, weights, rm in cases:
    config = main_config()
    config.reward.sources = weights
    for key, value in rm.items():
      config.reward.model[key] = value
    reward = sources.make_reward(config, tok, None, mesh, task="verifier")
    results.append((name, median_ms(lambda: reward(rows), args.repeats)))
  base = results[0][1]
  forward = policy_forward_ms(rows, args.repeats)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {len(rows.completions)} rows, "
        f"{args.repeats} repeats (median)")
  print("| scoring phase | ms per batch | x verifier alone | reward model adds | "
        "x a policy forward |")
  print("|---|---|---|---|---|")
  for name, ms in results:
    extra = ms - base
    print(f"| {name} | {ms:.1f} | {ms / base:.2f} | {extra:+.1f} ms | {extra / forward:.2f} |")
  print(f"| (a policy forward, same rows) | {forward:.1f} | | | 1.00 |")


if __name__ == "__main__":
  main()

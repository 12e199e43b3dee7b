"""Tiny random ``transformers`` models for parity tests (built with CPU torch, saved to disk)."""
import numpy as np

VOCAB = 97
ARCHS = ("llama", "qwen2", "llama_gqa_tied", "llama3_rope", "qwen3", "gemma3", "qwen3_moe")


def hf_config(name: str):
  import transformers
  common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, rms_norm_eps=1e-5, max_position_embeddings=256,
                eos_token_id=2, bos_token_id=1, pad_token_id=0)
  if name == "llama":
    return transformers.LlamaConfig(num_key_value_heads=4, rope_theta=10000.0,
                                    tie_word_embeddings=False, **common)
  if name == "qwen2":
    return transformers.Qwen2Config(num_key_value_heads=2, rope_theta=1e6,
                                    tie_word_embeddings=False, **common)
  if name == "llama_gqa_tied":
    return transformers.LlamaConfig(num_key_value_heads=1, rope_theta=5e5,
                                    tie_word_embeddings=True, **common)
  if name == "llama3_rope":
    return transformers.LlamaConfig(
        num_key_value_heads=2, tie_word_embeddings=False, rope_theta=5e5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        **common)
  if name == "qwen3":
    return transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                                    tie_word_embeddings=True, **common)
  if name == "gemma3":  # a local layer with a 4-token window, then a global one
    return transformers.Gemma3TextConfig(
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e6}}, **common)
  if name == "qwen3_moe":  # layer 0 dense, layer 1 sparse: 4 experts, 2 per token
    return transformers.Qwen3MoeConfig(
        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0],
        tie_word_embeddings=False, **common)
  raise KeyError(name)


def build(name: str, path: str, seed: int = 0, **overrides) -> str:
  """Random weights (biases made non-zero so they are tested), saved as safetensors;
  ``overrides``: config fields that differ from ``hf_config(name)``'s."""
  import torch
  import transformers
  torch.manual_seed(seed)
  config = hf_config(name)
  for key, value in overrides.items():
    setattr(config, key, value)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if pname.endswith("bias") or "norm" in pname:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return path


def hf_logits(path: str, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Logits from ``transformers`` with position ids from the mask, as ``generate`` does."""
  import torch
  import transformers
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  model.eval()
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(pos, dtype=torch.long))
  return out.logits.double().numpy()


def left_padded(lengths, width, vocab, seed):
  rng = np.random.default_rng(seed)
  tokens = np.zeros((len(lengths), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, n in enumerate(lengths):
    tokens[i, width - n:] = rng.integers(3, vocab, n)
    mask[i, width - n:] = 1
  return tokens, mask


REWARD_ARCHS = ("llama", "qwen2", "qwen3")  # the families' *ForSequenceClassification


def build_reward_model(name: str, path: str, seed: int = 0, num_labels: int = 1,
                       vocab: int = VOCAB) -> str:
  """A random ``*ForSequenceClassification`` of ``hf_config(name)`` (``pad_token_id`` 0, by which
  ``transformers`` pools each row at its last non-padding token) with ``vocab`` ids, saved as
  safetensors."""
  import torch
  import transformers
  torch.manual_seed(seed)
  config = hf_config(name)
  config.num_labels = num_labels
  config.vocab_size = vocab
  model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if pname.endswith("bias") or "norm" in pname:
        p.add_(0.1 * torch.randn_like(p))
      if pname == "score.weight":  # transformers' init is small: make the scores O(1)
        p.normal_(0.0, 1.0)
  model.save_pretrained(path)
  return path


def hf_scores(path: str, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Scores [B] of a saved sequence classifier with one label, position ids from the mask."""
  import torch
  import transformers
  model = transformers.AutoModelForSequenceClassification.from_pretrained(path,
                                                                          dtype=torch.float32)
  model.eval()
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(pos, dtype=torch.long))
  return out.logits[:, 0].double().numpy()


def prompt_and_completion(prompt_lengths, completion_lengths, prompt_width, completion_width,
                          vocab, seed, pad_id=0):
  """Rows as rljax scores them: left-padded prompts then right-padded completions, padding
  ``pad_id`` and real tokens from 3 on (never the pad id): tokens and mask [B, P + T]."""
  rng = np.random.default_rng(seed)
  rows = len(prompt_lengths)
  tokens = np.full((rows, prompt_width + completion_width), pad_id, np.int32)
  mask = np.zeros_like(tokens)
  for i, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
    span = slice(prompt_width - p, prompt_width + c)
    tokens[i, span] = rng.integers(3, vocab, p + c)
    mask[i, span] = 1
  return tokens, mask


def build_tokenizer(path: str, pad: bool = True) -> str:
  """A byte-level BPE trained on a few strings, saved as a ``transformers`` tokenizer with EOS
  and BOS, and a pad token only when ``pad`` (many decoder-only tokenizers define none)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<eos>", "<bos>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["what is 2 + 3?", "the answer is 5", "12+7*3=33"] * 10, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>",
                                 **({"pad_token": "<pad>"} if pad else {}))
  fast.save_pretrained(path)
  return path

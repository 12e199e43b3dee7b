"""The sampler against ``transformers`` greedy ``generate`` and a teacher-forced forward pass."""
import jax
import numpy as np
import pytest

from rljax import models
from rljax.models import transformer
from rljax.rollout import SamplingParams, process_logits, sample
from tests import hf_models

T = 16
LENGTHS = [12, 7, 3, 9, 1, 5]


def _hf_greedy(path, tokens, mask, eos):
  import torch
  import transformers
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor(tokens, dtype=torch.long),
                         attention_mask=torch.tensor(mask, dtype=torch.long), max_new_tokens=T,
                         do_sample=False, eos_token_id=eos, pad_token_id=0)
  out = out[:, tokens.shape[1]:].numpy()
  return np.pad(out, ((0, 0), (0, T - out.shape[1])))  # generate stops when every row is done


def _stop_token_in_the_middle(free_run):
  """A token that ends some rows mid-way and never appears in at least one other row."""
  best, best_score = None, -1
  for tok in np.unique(free_run):
    first = [np.flatnonzero(row == tok)[:1] for row in free_run]
    middle = sum(1 for f in first if len(f) and 1 <= f[0] <= T - 3)
    absent = sum(1 for f in first if not len(f))
    if absent and middle > best_score:
      best, best_score = int(tok), middle
  assert best_score >= 1, "no usable stop token: change the prompts' seed"
  return best


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3", "qwen3_moe"])
def test_greedy_equals_transformers_generate(arch, hf_dirs):
  tokens, mask = hf_models.left_padded(LENGTHS, width=12, vocab=hf_models.VOCAB, seed=1)
  stop = _stop_token_in_the_middle(_hf_greedy(hf_dirs[arch], tokens, mask, eos=None))
  theirs = _hf_greedy(hf_dirs[arch], tokens, mask, eos=stop)
  cfg, params = models.load_hf(hf_dirs[arch])
  sp = SamplingParams(greedy=True, max_new_tokens=T, stop_ids=(stop,), pad_id=0)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(0), sp))
  np.testing.assert_array_equal(r.tokens, theirs)
  # Masks: 1 up to and including the first stop token, then padding.
  has_stop = (theirs == stop).any(1)
  first = np.where(has_stop, np.argmax(theirs == stop, 1) + 1, T)
  np.testing.assert_array_equal(r.lengths, first)
  np.testing.assert_array_equal(r.mask, (np.arange(T)[None] < first[:, None]).astype(np.int32))
  np.testing.assert_array_equal(r.truncated, ~has_stop)
  assert has_stop.any() and (~has_stop).any() and (first[has_stop] < T).any()
  assert (r.tokens[r.mask == 0] == 0).all() and (r.sampler_logp[r.mask == 0] == 0).all()
  assert (r.draw_logp == 0).all()  # greedy: the processed distribution is a point mass
  tf_logp = np.take_along_axis(_log_softmax(_teacher_forced_logits(cfg, params, r)),
                               r.tokens[..., None], -1)[..., 0]
  assert np.abs(tf_logp - r.sampler_logp)[r.mask == 1].max() <= 1e-4


def _teacher_forced_logits(cfg, params, r):
  full = np.concatenate([r.prompt_tokens, r.tokens], 1)
  full_mask = np.concatenate([r.prompt_mask, r.mask], 1)
  logits = np.asarray(jax.jit(transformer.logits, static_argnums=0)(cfg, params, full, full_mask))
  p = r.prompt_tokens.shape[1]
  return logits[:, p - 1:-1]  # [B, T, V]: position P-1+t predicts completion token t


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  m = np.max(x, -1, keepdims=True)
  return x - m - np.log(np.sum(np.exp(x - m), -1, keepdims=True))


def test_logp_equals_teacher_forced_forward(hf_dirs):
  """Sampling (all transforms on) with groups; GQA (R = 2) and Llama-3 RoPE scaling."""
  cfg, params = models.load_hf(hf_dirs["llama3_rope"])
  tokens, mask = hf_models.left_padded(LENGTHS, width=16, vocab=hf_models.VOCAB, seed=2)
  sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=24,
                      stop_ids=(3, 4, 5))
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(7), sp, group_size=3))
  assert r.tokens.shape == (18, 24) and r.prompt_tokens.shape == (18, 16)
  np.testing.assert_array_equal(r.prompt_tokens, np.repeat(tokens, 3, 0))  # groups contiguous
  logits = _teacher_forced_logits(cfg, params, r)
  valid = r.mask.astype(bool)
  assert valid.sum() > 100
  tf_logp = np.take_along_axis(_log_softmax(logits), r.tokens[..., None], -1)[..., 0]
  assert np.abs(tf_logp - r.sampler_logp)[valid].max() <= 1e-4
  processed = np.asarray(process_logits(logits, sp))
  tf_slogp = np.take_along_axis(_log_softmax(processed), r.tokens[..., None], -1)[..., 0]
  assert np.abs(tf_slogp - r.draw_logp)[valid].max() <= 1e-4
  # The processed distribution is sharper than the policy.
  assert (r.draw_logp[valid] >= r.sampler_logp[valid] - 1e-4).mean() > 0.5

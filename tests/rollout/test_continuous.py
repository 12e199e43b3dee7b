"""Continuous batching (``max_concurrent_rows`` < rows): the same rollout as all rows at once,
whatever the slot budget; against ``transformers`` greedy ``generate``; its schedule against a
NumPy simulation; the slot budget; low-precision sampling; the default stop set (the model's EOS).
"""
import functools

import jax
import numpy as np
import pytest

from rljax import models
from rljax.models import ModelConfig, transformer
from rljax.rollout import SamplingParams, continuous, kv_blocks, sample, sampler, slot_budget
from tests import hf_models
from tests.models.test_generation_parity import (T, _hf_greedy, _log_softmax, _stop_token_in_the_middle,
                                       _teacher_forced_logits)
from tests.rollout.test_sampling import (CASES, LOGITS, STOP, V, _chi_square_pvalue, _prompts,
                                         _reference_probs, assert_rows_stop_and_pad,
                                         controlled_model)

CFG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, max_position_embeddings=128)
G, T_NEW = 3, 20


@functools.lru_cache(maxsize=None)
def _random_model():
  params = jax.device_get(transformer.init_params(CFG, 0))
  params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 20  # spread-out logits
  return params


def _batch():
  tokens = np.random.default_rng(0).integers(1, 32, (6, 8)).astype(np.int32)
  mask = np.ones_like(tokens)
  mask[1, :3] = 0
  mask[4, :6] = 0
  return tokens, mask


def _assert_same_rollout(got, want, atol=1e-5):
  for name in ("prompt_tokens", "prompt_mask", "tokens", "mask", "lengths", "truncated"):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
  for name in ("sampler_logp", "draw_logp"):
    np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=atol, err_msg=name)


@pytest.mark.parametrize("sp,budgets", [
    (SamplingParams(greedy=True, max_new_tokens=T_NEW, stop_ids=(3, 7)), (5,)),
    pytest.param(SamplingParams(temperature=1.2, top_k=10, top_p=0.95, max_new_tokens=T_NEW,
                                stop_ids=(3, 7)), (1, 7), marks=pytest.mark.slow)],
    ids=["greedy", "sampled"])
def test_same_rollout_as_all_rows_at_once_for_several_budgets(sp, budgets):
  """B = 18 rows through S = 1, 5, 7 slots: tokens, masks, flags equal the all-rows
  sampler's (same noise per row and token index); rows end anywhere between 1 and T tokens."""
  params, (tokens, mask) = _random_model(), _batch()
  want = jax.device_get(sample(CFG, params, tokens, mask, jax.random.key(1), sp, group_size=G))
  # Rows finish at very different steps (greedy: a group's rows are the same).
  assert want.lengths.min() <= 7 and want.lengths.max() == T_NEW and want.truncated.any()
  assert len(set(want.lengths.tolist())) >= 4
  np.testing.assert_array_equal(want.prompt_tokens, np.repeat(tokens, G, 0))  # groups contiguous
  for slots in budgets:
    got = jax.device_get(sample(CFG, params, tokens, mask, jax.random.key(1), sp, group_size=G,
                                max_concurrent_rows=slots))
    _assert_same_rollout(got, want)


def test_greedy_equals_transformers_generate_with_fewer_slots_than_rows(hf_dirs, slots=2):
  lengths = [12, 7, 3, 9, 1, 5]
  tokens, mask = hf_models.left_padded(lengths, width=12, vocab=hf_models.VOCAB, seed=1)
  stop = _stop_token_in_the_middle(_hf_greedy(hf_dirs["llama"], tokens, mask, eos=None))
  theirs = _hf_greedy(hf_dirs["llama"], tokens, mask, eos=stop)
  cfg, params = models.load_hf(hf_dirs["llama"])
  sp = SamplingParams(greedy=True, max_new_tokens=T, stop_ids=(stop,), pad_id=0)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(0), sp,
                            max_concurrent_rows=slots))
  np.testing.assert_array_equal(r.tokens, theirs)
  has_stop = (theirs == stop).any(1)
  first = np.where(has_stop, np.argmax(theirs == stop, 1) + 1, T)
  np.testing.assert_array_equal(r.lengths, first)
  np.testing.assert_array_equal(r.truncated, ~has_stop)
  assert len(set(first.tolist())) >= 3 and has_stop.any() and (~has_stop).any()
  tf = np.take_along_axis(_log_softmax(_teacher_forced_logits(cfg, params, r)),
                          r.tokens[..., None], -1)[..., 0]
  assert np.abs(tf - r.sampler_logp)[r.mask == 1].max() <= 1e-4


def test_frequencies_through_slots_match_processed_distribution(fixed):
  """2048 rows x 4 steps through 96 slots: chi-square against the processed distribution."""
  cfg, params = fixed
  sp = SamplingParams(max_new_tokens=4, **CASES["all"])
  tokens, mask = _prompts(16)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(42), sp, group_size=128,
                            max_concurrent_rows=96))
  assert r.tokens.shape == (2048, 4) and r.mask.all() and r.truncated.all()
  probs = _reference_probs(LOGITS, **CASES["all"])
  assert _chi_square_pvalue(r.tokens, probs) > 1e-3
  assert _chi_square_pvalue(r.tokens[:, 3], probs) > 1e-3  # the tokens drawn in decode steps
  np.testing.assert_allclose(r.sampler_logp, np.log(_reference_probs(LOGITS))[r.tokens],
                             atol=1e-5)
  np.testing.assert_allclose(r.draw_logp, np.log(probs[r.tokens]), atol=1e-5)


@pytest.fixture(scope="module")
def fixed():
  return controlled_model(LOGITS)


def test_stop_tokens_truncation_and_padding_through_slots():
  """Rows that hit no stop token within T are truncated and flagged; padding after a stop."""
  cfg, params = controlled_model(LOGITS + np.eye(V)[STOP] * 1.2)  # stop w.p. ~0.15 per step
  sp = SamplingParams(max_new_tokens=12, stop_ids=(STOP,), pad_id=0)
  tokens, mask = _prompts(4, p=8)
  r = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(3), sp, group_size=16,
                            max_concurrent_rows=5))
  assert_rows_stop_and_pad(r, STOP, 12)


def _simulate_schedule(lengths, slots, refill_rows):
  """Token slots the continuous loop computes for rows of ``lengths``, re-implemented in NumPy
  from the schedule in docs/rollout.md: rows enter in order; a refill of up to ``refill_rows``
  rows runs when ``min(refill_rows, pending)`` slots are free; once nothing is pending the loop
  narrows to S/2, S/4, S/8 slots whenever the active rows fit."""
  b, nxt, computed = len(lengths), 0, len(lengths)
  remaining, active = np.zeros(slots, int), np.zeros(slots, bool)

  def refill(size):
    nonlocal nxt
    for s in np.flatnonzero(~active)[:min(size, b - nxt)]:
      remaining[s] = lengths[nxt] - 1
      active[s] = remaining[s] > 0
      nxt += 1

  refill(slots)
  widths = sorted({max(1, slots >> k) for k in range(4)}, reverse=True)
  for i, width in enumerate(widths):
    next_width = widths[i + 1] if i + 1 < len(widths) else 0
    while nxt < b or active.sum() > next_width:
      if i == 0 and nxt < b and slots - active.sum() >= min(refill_rows, b - nxt):
        refill(refill_rows)
      computed += width
      remaining[active] -= 1
      active &= remaining > 0
  return computed


@pytest.mark.parametrize("slots,refill_rows",
                         [(5, 1), pytest.param(8, 3, marks=pytest.mark.slow)])
def test_schedule_matches_a_numpy_simulation(slots, refill_rows):
  """Per-row budgets (the long-tail benchmark's stop rule) of 1..T tokens: the loop computes
  exactly the token slots the simulated schedule does, and far fewer than all rows at once."""
  params, (tokens, mask) = _random_model(), _batch()
  budget = np.random.default_rng(5).integers(1, T_NEW + 1, 6 * G).astype(np.int32)
  sp = SamplingParams(temperature=1.0, max_new_tokens=T_NEW, stop_ids=())
  run = jax.jit(functools.partial(sampler._sample_impl, cfg=CFG, sp=sp, group_size=G,
                                  with_stats=True, max_concurrent_rows=slots,
                                  refill_rows=refill_rows))
  r, stats = jax.device_get(run(params, tokens, mask, jax.random.key(0), row_budget=budget))
  np.testing.assert_array_equal(r.lengths, budget)
  assert r.truncated.all()
  assert int(stats["computed"]) == _simulate_schedule(budget, slots, refill_rows)
  assert int(stats["computed"]) < len(budget) * T_NEW


def test_slot_budget_from_rows_and_bytes():
  cfg = CFG  # 2 layers x 2 kv heads x 8 dims x 4 bytes x (k, v): 256 bytes per cache slot
  per_row = 256 * (8 + 20)
  assert slot_budget(cfg, 18, 8, 20, None, None) == 18
  assert slot_budget(cfg, 18, 8, 20, 7, None) == 7
  assert slot_budget(cfg, 18, 8, 20, None, int(3.5 * per_row)) == 3
  assert slot_budget(cfg, 18, 8, 20, 2, 10 * per_row) == 2
  assert slot_budget(cfg, 18, 8, 20, 40, None) == 18
  with pytest.raises(ValueError, match="kv_cache_bytes"):
    slot_budget(cfg, 18, 8, 20, None, per_row - 1)
  assert continuous.drain_widths(32) == [32, 16, 8, 4]
  assert continuous.drain_widths(3) == [3, 1]


@pytest.mark.slow
def test_bfloat16_sampling_logp_gap_to_float32_forward_is_bounded():
  """``dtype='bfloat16'`` (weights and KV cache): the sampler's log-probs differ from a float32
  teacher-forced forward by at most 0.1 (mean 0.02) on this model (measured on CPU: 0.032, mean
  0.0061, over 245 tokens); float32 sampling by 1e-4."""
  params, (tokens, mask) = _random_model(), _batch()
  sp = SamplingParams(temperature=1.0, max_new_tokens=T_NEW, stop_ids=(3,))
  gaps = {}
  for dtype in ("float32", "bfloat16"):
    r = jax.device_get(sample(CFG, params, tokens, mask, jax.random.key(4), sp, group_size=G,
                              dtype=dtype, max_concurrent_rows=7))
    tf = np.take_along_axis(_log_softmax(_teacher_forced_logits(CFG, params, r)),
                            r.tokens[..., None], -1)[..., 0]
    gaps[dtype] = np.abs(tf - r.sampler_logp)[r.mask == 1]
    assert gaps[dtype].size > 100
  assert gaps["float32"].max() <= 1e-4
  assert 1e-3 < gaps["bfloat16"].max() <= 0.1 and gaps["bfloat16"].mean() <= 0.02
  with pytest.raises(ValueError, match="rollout.dtype"):
    sample(CFG, params, tokens, mask, jax.random.key(4), sp, dtype="int8")


def test_default_stop_set_is_the_models_eos():
  """``stop_ids=None`` (the default) stops at ``cfg.eos_token_id``, as ``generate`` does;
  ``stop_ids=()`` never stops."""
  cfg, params = controlled_model(LOGITS + np.eye(V)[STOP] * 1.2)
  cfg = cfg.replace(eos_token_id=STOP)
  tokens, mask = _prompts(4, p=8)
  key = jax.random.key(3)
  default = jax.device_get(sample(cfg, params, tokens, mask, key, SamplingParams(max_new_tokens=12),
                                  group_size=4))
  explicit = jax.device_get(sample(cfg, params, tokens, mask, key,
                                   SamplingParams(max_new_tokens=12, stop_ids=(STOP,)),
                                   group_size=4))
  never = jax.device_get(sample(cfg, params, tokens, mask, key,
                                SamplingParams(max_new_tokens=12, stop_ids=()), group_size=4))
  _assert_same_rollout(default, explicit, atol=0)
  assert (~default.truncated).any() and never.truncated.all() and (never.tokens == STOP).any()


def test_cpu_chunks_of_slots_give_the_same_rollout(monkeypatch):
  """The CPU cache blocking of continuous batching (rows in 2 sequential chunks of S/2 slots)."""
  from rljax.rollout import decode
  params, (tokens, mask) = _random_model(), _batch()
  sp = SamplingParams(temperature=1.2, max_new_tokens=T_NEW, stop_ids=(3, 7))
  want = jax.device_get(sample(CFG, params, tokens, mask, jax.random.key(1), sp, group_size=G))
  monkeypatch.setattr(decode, "CPU_TUNED_BACKENDS", (jax.default_backend(),))
  monkeypatch.setattr(sampler, "CPU_CHUNK_BYTES", 3 * sampler._cache_bytes_per_row(CFG, 8 + T_NEW))
  assert sampler.continuous_chunks(CFG, 6, G, 6, 8 + T_NEW) == 1  # chunks of 3 < 16 slots
  monkeypatch.setattr(sampler, "CPU_MIN_CHUNK_SLOTS", 3)
  assert sampler.continuous_chunks(CFG, 6, G, 6, 8 + T_NEW) == 2  # 3 slots per chunk of 9 rows
  run = jax.jit(functools.partial(sampler._sample_impl, cfg=CFG, sp=sp, group_size=G,
                                  max_concurrent_rows=6))
  _assert_same_rollout(jax.device_get(run(params, tokens, mask, jax.random.key(1))), want)


def test_cache_blocks_and_sliding_window_give_the_same_rollout(monkeypatch):
  """Completion positions in cache blocks of 8 (8, 8, 4 for T = 20: a step reads 1, 2 or 3 of
  them as the deepest slot goes on) and a sliding window of 6 slots: the same rollout as all
  rows at once with the same window (which does change the rollout)."""
  assert kv_blocks.block_sizes(20, 8) == (8, 8, 4)
  np.testing.assert_array_equal(
      [int(kv_blocks.blocks_needed(t, (8, 8, 4))) for t in range(1, 21)],
      [1] * 8 + [2] * 8 + [3] * 4)
  cfg = CFG.replace(sliding_window=6)
  params, (tokens, mask) = _random_model(), _batch()
  sp = SamplingParams(temperature=1.2, max_new_tokens=T_NEW, stop_ids=(3, 7))
  want = jax.device_get(sample(cfg, params, tokens, mask, jax.random.key(1), sp, group_size=G))
  unwindowed = jax.device_get(sample(CFG, params, tokens, mask, jax.random.key(1), sp,
                                     group_size=G))
  assert (want.tokens != unwindowed.tokens).any()
  monkeypatch.setattr(kv_blocks, "BLOCK_SLOTS", 8)
  run = jax.jit(functools.partial(sampler._sample_impl, cfg=cfg, sp=sp, group_size=G,
                                  max_concurrent_rows=4))
  _assert_same_rollout(jax.device_get(run(params, tokens, mask, jax.random.key(1))), want)

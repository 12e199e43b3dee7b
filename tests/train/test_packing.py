"""Sequence packing (rljax.learner.packing): the layout against a hand-worked case and a NumPy
first-fit decreasing, every token placed once, and the round trip back to the padded layout."""
import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.learner import packing
from rljax.learner.step import StepSpec


def test_first_fit_decreasing_hand_worked():
  """Lengths 3, 5, 2, 4, 1 into rows of 6, 2 rows a chunk: by decreasing length 5 -> row 0,
  4 -> row 1, 3 -> row 2 (neither has 3 free), 2 -> row 1 (2 free, after the 4), 1 -> row 0
  (after the 5). Three rows used, two chunks, 15 tokens in 2 x 2 x 6 slots."""
  shape = packing.chunk_shape(5, 6, 2)
  assert shape == (3, 2, 6)
  lay = jax.jit(packing.first_fit_decreasing, static_argnums=1)(np.array([3, 5, 2, 4, 1]), shape)
  np.testing.assert_array_equal(lay.row, [2, 0, 1, 1, 0])
  np.testing.assert_array_equal(lay.offset, [0, 0, 4, 0, 5])
  np.testing.assert_array_equal(lay.segment, [1, 1, 2, 1, 2])
  assert int(lay.used_rows) == 3 and int(lay.used_chunks) == 2
  np.testing.assert_allclose(float(lay.fill), 15 / 24)


def test_chunk_shape_rules():
  assert packing.chunk_shape(8, 16, 3) == (3, 3, 16)  # every sequence alone still fits: 3 x 3
  assert packing.chunk_shape(4, 16, 10) == (1, 4, 16)  # no more rows than sequences
  with pytest.raises(ValueError, match="chunk_rows=0"):
    packing.chunk_shape(4, 16, 0)
  with pytest.raises(ValueError, match="do not fit"):
    packing.layout(jnp.ones((2, 9)), (1, 2, 8))


def _numpy_ffd(lengths, width):
  """First-fit decreasing as the textbook writes it: (row, offset, segment) of each item."""
  free, count, out = [], [], {}
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    row = next((j for j, f in enumerate(free) if f >= lengths[i]), None)
    if row is None:
      free.append(width), count.append(0)
      row = len(free) - 1
    out[i] = (row, width - free[row], count[row] + 1)
    free[row] -= lengths[i]
    count[row] += 1
  return [out[i] for i in range(len(lengths))]


def _batch(rng, rows, prompt, completion):
  """Left-padded prompts and right-padded completions of random lengths (some empty)."""
  p_len = rng.integers(1, prompt + 1, rows)
  c_len = rng.integers(0, completion + 1, rows)
  valid = np.zeros((rows, prompt + completion), np.int32)
  for i in range(rows):
    valid[i, prompt - p_len[i]:prompt + c_len[i]] = 1
  return valid


ROWS, PROMPT, COMPLETION, CHUNK_ROWS = 12, 5, 11, 3


@functools.lru_cache(maxsize=None)
def _round_trip_fns():
  shape = packing.chunk_shape(ROWS, PROMPT + COMPLETION, CHUNK_ROWS)

  def fn(x, valid):
    lay = packing.layout(valid, shape)
    packed = packing.pack(x, valid, lay)
    back = packing.unpack(packed, valid, lay)
    one = packing.unpack(packed[1], valid, lay, chunk=1)
    return (lay, packed, packing.segment_ids(valid, lay), packing.next_tokens(x, valid, lay),
            back, one, packing.completion(back, valid, PROMPT))
  return jax.jit(fn), shape


@pytest.mark.parametrize("seed", [0, 1])
def test_pack_places_every_token_once_and_unpack_inverts_it(seed):
  rng = np.random.default_rng(seed)
  valid = _batch(rng, ROWS, PROMPT, COMPLETION)
  width = PROMPT + COMPLETION
  ids = (np.arange(ROWS * width).reshape(ROWS, width) + 1).astype(np.int32)  # one id per slot
  fn, shape = _round_trip_fns()
  lay, packed, seg, nxt, back, one, comp = jax.tree.map(np.asarray, fn(ids, valid))
  lengths = valid.sum(1)
  # The layout is NumPy's first-fit decreasing.
  assert list(zip(lay.row, lay.offset, lay.segment)) == _numpy_ffd(list(lengths), width)
  # Every valid slot's id appears exactly once, nothing else does; no row holds more than W.
  placed = packed[packed > 0]
  assert sorted(placed) == sorted(ids[valid > 0])
  assert (seg > 0).sum() == lengths.sum()
  # Each sequence is one contiguous run of its own segment id, in order, ids rising along a row.
  flat, flat_seg = packed.reshape(-1, width), seg.reshape(-1, width)
  for b in range(ROWS):
    run = flat[lay.row[b], lay.offset[b]:lay.offset[b] + lengths[b]]
    np.testing.assert_array_equal(run, ids[b][valid[b] > 0])
    assert (flat_seg[lay.row[b], lay.offset[b]:lay.offset[b] + lengths[b]] == lay.segment[b]).all()
  for row in flat_seg:
    used = row[row > 0]
    assert (np.diff(used) >= 0).all() and (used[0] == 1 if used.size else True)
  assert int(lay.used_chunks) == -(-int(lay.used_rows) // shape[1])
  assert int(lay.used_chunks) < shape[0]  # this batch packs into fewer chunks than the worst case
  # unpack(pack(x)) = x on the valid slots, 0 elsewhere; one chunk gives its rows only.
  np.testing.assert_array_equal(back, np.where(valid > 0, ids, 0))
  in_chunk = (lay.row // shape[1] == 1)[:, None]
  np.testing.assert_array_equal(one, np.where((valid > 0) & in_chunk, ids, 0))
  # Targets: the next token of the same sequence, 0 after its last.
  expect_next = np.zeros_like(flat)
  for b in range(ROWS):
    toks = ids[b][valid[b] > 0]
    expect_next[lay.row[b], lay.offset[b]:lay.offset[b] + lengths[b] - 1] = toks[1:]
  np.testing.assert_array_equal(nxt.reshape(-1, width), expect_next)
  # The completion's layout: token t predicted at slot P + t - 1, 0 unless both are valid.
  both = (valid[:, PROMPT - 1:-1] > 0) & (valid[:, PROMPT:] > 0)
  np.testing.assert_array_equal(comp, np.where(both, ids[:, PROMPT - 1:-1], 0))


def test_auto_packs_from_two_chunks_on_cpu_and_true_false_force_it():
  """``model.pack``: 'auto' packs a forward whose packed layout has 2+ chunks (one chunk leaves
  nothing to skip), on CPU only; True / False and the command line's strings force it."""
  assert not packing.packs("auto", 1, "cpu")
  assert packing.packs("auto", 2, "cpu") and packing.packs("auto", 7, "cpu")
  assert not packing.packs("auto", 8, "gpu") and not packing.packs("auto", 8, "tpu")
  for on in (True, "True", "true"):
    assert packing.packs(on, 1, "cpu") and packing.packs(on, 1, "gpu")
  for off in (False, "False", "false"):
    assert not packing.packs(off, 8, "cpu")
  with pytest.raises(ValueError, match="model.pack='yes'"):
    packing.packs("yes", 2, "cpu")


def test_capacity_dispatch_is_never_packed_and_true_is_refused_in_one_line():
  """Was: packed under 'capacity' (grad norm 1.986 vs 2.010 padded; the log-prob gap 3.5x larger)
  and 'auto' switched between the two by chunk count. A capacity dispatch is a function of the
  tokens that share a forward (packing module docstring): 'auto' keeps the padded rows, True is
  refused at start-up with the reason; the dropless dispatches still pack."""
  import rljax
  from rljax.config import checks as config_checks
  from rljax.config.table import CAPACITY_UNPACKED
  from rljax.errors import ConfigError
  from rljax import models
  assert not packing.packs("auto", 8, "cpu", capacity=True)
  assert not packing.packs("False", 8, "cpu", capacity=True)
  with pytest.raises(ValueError, match="model.moe_dispatch='capacity'"):
    packing.packs(True, 8, "cpu", capacity=True)
  config = rljax.config()
  config.model.update(family="qwen3_moe", hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, moe_intermediate_size=16, num_experts=4,
                      experts_per_token=2, moe_dispatch="capacity", pack="True")
  with pytest.raises(ConfigError) as e:
    config_checks.check_config(config)
  assert str(e.value).endswith(CAPACITY_UNPACKED) and "\n" not in str(e.value)
  cfg = models.tiny_config(config.model, 40, eos_token_id=1, pad_token_id=0)
  spec = StepSpec(algo=types.SimpleNamespace(minibatches=1, micro_batches=1), model_cfg=cfg,
                  actor_tx=None, critic_tx=None, logits_chunk=0, forward_tokens=2048,
                  pack="auto", platform="cpu")
  assert cfg.moe_dispatch == "capacity" and spec.pack_shape(16, 256) is None
  assert "scoring padded, update padded" in spec.describe_packing(16, 256)
  sparse = dataclasses.replace(spec, model_cfg=cfg.replace(moe_dispatch="sparse"))
  assert sparse.pack_shape(16, 256) == (2, 8, 256)


def test_auto_resolves_per_forward_from_the_chunk_count_hand_counted():
  """``StepSpec.pack_shape`` with 2048 tokens a chunk (auto on a two-thread CPU device): 16 rows
  of 128 tokens fit one chunk of 16 rows (padded); of 256 tokens, chunks of 2048 / 256 = 8 rows,
  2 chunks (packed); 128 tokens with 2 micro-batches, chunks of at most 16 / 2 = 8 rows, 2
  chunks (packed). With no token limit (auto on accelerators) one chunk of the micro-batch."""
  spec = StepSpec(algo=None, model_cfg=None, actor_tx=None, critic_tx=None, logits_chunk=0,
                  forward_tokens=2048, pack="auto", platform="cpu")
  assert spec.pack_shape(16, 128) is None
  assert spec.pack_shape(16, 256) == (2, 8, 256)
  assert spec.pack_shape(16, 128, at_least=2) == (2, 8, 128)
  assert dataclasses.replace(spec, pack="True").pack_shape(16, 128) == (1, 16, 128)
  assert dataclasses.replace(spec, pack="False").pack_shape(16, 256) is None
  assert dataclasses.replace(spec, platform="gpu").pack_shape(16, 256) is None
  assert dataclasses.replace(spec, forward_tokens=0).pack_shape(16, 512) is None
  # The start-up line: 32 rows of 128 tokens score in 2 chunks of 16; the update's minibatches
  # of 32 / 2 = 16 rows fit one chunk.
  two_minibatches = dataclasses.replace(
      spec, algo=types.SimpleNamespace(minibatches=2, micro_batches=1))
  assert two_minibatches.describe_packing(32, 128).startswith(
      "packing: model.pack=auto on cpu -> scoring packed (2 chunks of 16 rows), update padded "
      "for rows of 128 tokens")

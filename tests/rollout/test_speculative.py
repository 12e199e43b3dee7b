"""Speculative decoding (``rljax.rollout.speculative``, ``spec_decode``): hand-worked prompt
lookup, the acceptance / residual formulas against NumPy (and Leviathan et al.'s theorem: the
emitted token's law is ``p``), greedy rollouts identical to the plain sampler for both drafts, a
chi-square test that sampled rollouts (temperature + top-p, groups) follow the policy's exact
joint distribution (with a check that a 1% shift is detected at the same sample size), recorded
log-probs equal to the teacher-forced forward, a draft equal to the policy always accepted, the
engine built from a config, and the one-line refusals."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from scipy import stats

import rljax
from rljax.config.checks import check_config
from rljax.errors import ConfigError, UnusedKeyError
from rljax.models import ModelConfig, transformer
from rljax.rollout import SamplingParams, left_pad, sample, sampler, speculative
from rljax.rollout.engines import ROLLOUT_ENGINES, Placement
from rljax.rollout.speculative import Draft
from tests.models.test_generation_parity import _log_softmax, _teacher_forced_logits
from tests import xla_cache
from tests.rollout.test_sampling import _reference_probs


@pytest.fixture(autouse=True, scope="module")
def _no_persistent_cache():
  """Compiled here without the session's compilation cache: serialising one of these programs
  into it crashed a worker once (a segfault inside jax's executable serialisation, in
  ``compilation_cache.put_executable_and_time``); they are compiled by this file alone."""
  with xla_cache.off():
    yield

V = 8
CFG = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=16, max_position_embeddings=64)
DRAFTS = {"ngram": Draft("ngram", tokens=3, ngram=2), "layers": Draft("layers", tokens=3, layers=1)}
GREEDY = SamplingParams(greedy=True, max_new_tokens=12, stop_ids=(5,), pad_id=0)
TOKENS, MASK = left_pad([[1, 5, 7, 1, 5], [2, 6], [4, 4, 2, 6]], 1, 0)


@functools.lru_cache(maxsize=None)
def _params():
  params = jax.device_get(transformer.init_params(CFG, 0))
  params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 30  # spread-out logits
  return params


def _spec(sp, draft, tokens=TOKENS, mask=MASK, g=2, key=0):
  return jax.device_get(sampler._sample_jit(_params(), tokens, mask, jax.random.key(key), cfg=CFG,
                                            sp=sp, group_size=g, draft=draft, with_stats=True))


# --- the formulas ---------------------------------------------------------------------------------

def test_ngram_proposals_hand_worked():
  seq = np.array([[5, 1, 2, 3, 9, 1, 2, 0, 0],    # suffix [1 2] at 1..2: what followed, 3 9 1
                  [1, 2, 7, 1, 2, 8, 1, 2, 0],    # two earlier matches: the latest (ends at 4)
                  [4, 4, 4, 0, 0, 0, 0, 0, 0],    # n=2: [4 4] ends at 1, period 1: 4 4 4
                  [0, 0, 3, 6, 3, 6, 0, 0, 0],    # padding never matches; [3 6] at 2..3: 3 6 3
                  [0, 0, 1, 2, 3, 0, 0, 0, 0]])   # no match: the last token repeated
  end = np.array([6, 7, 2, 5, 4])
  valid = np.arange(9)[None] <= end[:, None]
  valid[3, :2] = valid[4, :2] = False
  got, found = speculative.ngram_proposals(jnp.asarray(seq), jnp.asarray(valid), jnp.asarray(end),
                                           2, 3)
  np.testing.assert_array_equal(got, [[3, 9, 1], [8, 1, 2], [4, 4, 4], [3, 6, 3], [3, 3, 3]])
  np.testing.assert_array_equal(found, [True, True, True, True, False])
  # Left padding equal to the query is not a match: row [0 0 | 5 0 0]'s suffix [0 0] is real.
  pad_seq = jnp.asarray([[0, 0, 5, 0, 0]])
  got, found = speculative.ngram_proposals(pad_seq, jnp.asarray([[False, False, True, True, True]]),
                                           jnp.asarray([4]), 2, 2)
  assert not bool(found[0]) and got.tolist() == [[0, 0]]


def test_acceptance_residual_and_emission_match_numpy():
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(V), size=4)
  q = rng.dirichlet(np.ones(V), size=4)
  p[0, 2] = 0.0  # a token the target never draws
  p /= p.sum(-1, keepdims=True)
  d = np.array([2, 5, 1, 0])
  with np.errstate(divide="ignore"):
    lp, lq = np.log(p), np.log(q)
  got = speculative.acceptance_probs(jnp.asarray(lp[np.arange(4), d], jnp.float32),
                                     jnp.asarray(lq[np.arange(4), d], jnp.float32))
  np.testing.assert_allclose(got, np.minimum(1, p[np.arange(4), d] / q[np.arange(4), d]),
                             rtol=1e-5)
  res = np.exp(_log_softmax(speculative.residual_logits(jnp.asarray(lp, jnp.float32),
                                                         jnp.asarray(lq, jnp.float32))))
  want = np.maximum(p - q, 0)
  np.testing.assert_allclose(res, want / want.sum(-1, keepdims=True), atol=1e-5)
  # One-hot draft: accepted with p(d), the residual is p without d.
  np.testing.assert_allclose(speculative.acceptance_probs(jnp.asarray(lp[np.arange(4), d])),
                             p[np.arange(4), d], rtol=1e-5)
  res1 = np.exp(_log_softmax(speculative.residual_logits(jnp.asarray(lp, jnp.float32),
                                                          drafted=jnp.asarray(d))))
  want1 = p.copy()
  want1[np.arange(4), d] = 0
  np.testing.assert_allclose(res1, want1 / want1.sum(-1, keepdims=True), atol=1e-5)
  # Leviathan et al., Theorem 3.5: P(emit y) = q(y) min(1, p/q)(y) + (1 - beta) residual(y) = p(y).
  accept = q * np.minimum(1, p / q)
  emitted = accept + (1 - accept.sum(-1, keepdims=True)) * res
  np.testing.assert_allclose(emitted, p, atol=1e-5)
  # Accepted length: the leading run of u < prob; the block and its count (budget, stop token).
  n = speculative.accepted_length(jnp.asarray([[1.0, 1.0, 0.5], [0.2, 1.0, 1.0], [1, 1, 1.0]]),
                                  jnp.asarray([[0.3, 0.9, 0.6], [0.1, 0.5, 0.99], [0.9, 0, 0.5]]))
  np.testing.assert_array_equal(n, [2, 3, 3])
  block = speculative.emitted_block(jnp.asarray([[4, 5, 6], [7, 3, 1], [2, 2, 2]]), n,
                                    jnp.asarray([9, 8, 0]))
  np.testing.assert_array_equal(block, [[4, 5, 9, 9], [7, 3, 1, 8], [2, 2, 2, 0]])
  count, stopped = speculative.emitted_count(block, n, jnp.asarray([10, 10, 2]), (3,))
  np.testing.assert_array_equal(count, [3, 2, 2])  # row 1 stops at its 3; row 2 has room for 2
  np.testing.assert_array_equal(stopped, [False, True, False])

  # Acceptance figures, hand-worked: 5 verifications of k=3 accepted 4 of 15 drafted tokens and
  # emitted 4 + 5 tokens past the rows' prefill tokens (a row of budget 0 emits none).
  m = speculative.acceptance_metrics([2, 3, 0], [3, 1, 0], [6, 5, 0], 3)
  assert m == pytest.approx({"draft_accept_rate": 4 / 15, "tokens_per_verify": 9 / 5})


# --- the sampler ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(DRAFTS))
def test_greedy_rollout_is_the_plain_samplers(kind):
  plain = jax.device_get(sample(CFG, _params(), TOKENS, MASK, jax.random.key(0), GREEDY, 2))
  spec, st = _spec(GREEDY, DRAFTS[kind])
  for name in ("tokens", "mask", "lengths", "truncated", "prompt_tokens"):
    np.testing.assert_array_equal(getattr(spec, name), getattr(plain, name), err_msg=name)
  np.testing.assert_allclose(spec.sampler_logp, plain.sampler_logp, atol=1e-5)
  assert not spec.draw_logp.any()
  assert spec.truncated.any() and not spec.truncated.all()  # rows that stop and rows that do not
  assert 0 < st["accepted"] and st["verifies"] < spec.lengths.sum()  # drafts did get accepted
  # The record carries the per-row counts the trainer logs (plain sampling's carries none).
  assert speculative.STAT_VERIFIES not in plain.extras
  assert spec.extras[speculative.STAT_VERIFIES].sum() == st["verifies"]
  assert spec.extras[speculative.STAT_ACCEPTED].sum() == st["accepted"]


def test_cpu_chunks_of_rows_give_the_same_greedy_rollout(monkeypatch):
  """The sampler's CPU cache blocking (here 3 sequential chunks of one prompt's group) around
  the speculative loop, with per-chunk stats summed."""
  from rljax.rollout import decode
  plain = jax.device_get(sample(CFG, _params(), TOKENS, MASK, jax.random.key(0), GREEDY, 2))
  monkeypatch.setattr(decode, "CPU_TUNED_BACKENDS", (jax.default_backend(),))
  monkeypatch.setattr(sampler, "CPU_CHUNK_BYTES", 2 * sampler._cache_bytes_per_row(CFG, 5 + 12))
  assert sampler.prompts_per_chunk(CFG, 3, 5, 2, 12) == 1
  run = jax.jit(functools.partial(sampler._sample_impl, cfg=CFG, sp=GREEDY, group_size=2,
                                  draft=DRAFTS["ngram"], with_stats=True))
  got, st = jax.device_get(run(_params(), TOKENS, MASK, jax.random.key(0)))
  np.testing.assert_array_equal(got.tokens, plain.tokens)
  np.testing.assert_array_equal(got.lengths, plain.lengths)
  _, whole = _spec(GREEDY, DRAFTS["ngram"])
  assert st["verifies"] == whole["verifies"] and st["accepted"] == whole["accepted"]


SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12, stop_ids=(6,), pad_id=0)


@pytest.mark.parametrize("kind, sp", [("ngram", GREEDY), ("layers", SAMPLED)],
                         ids=["ngram-greedy", "layers-sampled"])
def test_continuous_batching_verifies_each_slots_drafts(kind, sp):
  """4 slots for 6 rows (rows enter as others stop; refills of one row): the rollout, its
  log-probs and each row's acceptance counts equal the all-rows speculative loop's (a row's
  verification i draws the same noise in any slot); greedy, also plain continuous batching's
  tokens; sampled, the recorded log-probs are the teacher-forced forward's."""
  want, want_st = _spec(sp, DRAFTS[kind])
  got, st = jax.device_get(sampler._sample_jit(
      _params(), TOKENS, MASK, jax.random.key(0), cfg=CFG, sp=sp, group_size=2,
      max_concurrent_rows=4, draft=DRAFTS[kind], with_stats=True))
  assert st["slots"] == 4 and len(set(want.lengths.tolist())) >= 2  # rows end at different steps
  for name in ("tokens", "mask", "lengths", "truncated", "prompt_tokens"):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
  np.testing.assert_allclose(got.sampler_logp, want.sampler_logp, atol=1e-5)
  np.testing.assert_allclose(got.draw_logp, want.draw_logp, atol=1e-5)
  for name in (speculative.STAT_VERIFIES, speculative.STAT_ACCEPTED):
    np.testing.assert_array_equal(got.extras[name], want.extras[name], err_msg=name)
  assert st["accepted"] == want_st["accepted"] > 0
  if sp.is_greedy:
    plain = jax.device_get(sample(CFG, _params(), TOKENS, MASK, jax.random.key(0), sp, 2,
                                  max_concurrent_rows=4))
    np.testing.assert_array_equal(got.tokens, plain.tokens)
    np.testing.assert_array_equal(got.lengths, plain.lengths)
  else:
    logits = _teacher_forced_logits(CFG, _params(), got)
    lp = np.take_along_axis(_log_softmax(logits), got.tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(got.sampler_logp, np.where(got.mask > 0, lp, 0), atol=2e-5)


def _exact_joint(sp, prompt):
  """P(x_0, x_1, x_2) [V^3] under the processed distribution, from teacher-forced forwards over
  every prefix (NumPy float64 processing, ``_reference_probs``)."""
  prefixes = np.array(list(itertools.product(range(V), repeat=2)), np.int32)  # (x_0, x_1)
  seqs = np.concatenate([np.repeat(prompt[None], len(prefixes), 0), prefixes], 1)
  logits = np.asarray(transformer.logits(CFG, _params(), seqs, np.ones_like(seqs)))
  probs = lambda rows: np.stack([_reference_probs(x, temperature=sp.temperature, top_p=sp.top_p)
                                 for x in rows])
  p = len(prompt)
  p0 = probs(logits[:1, p - 1])[0]                       # [V]
  p1 = probs(logits[::V, p])                             # [V(x_0), V]
  p2 = probs(logits[:, p + 1]).reshape(V, V, V)          # [x_0, x_1, V]
  return (p0[:, None, None] * p1[:, :, None] * p2).reshape(-1)


def _pooled_pvalue(counts, probs):
  """Chi-square p-value of ``counts`` against ``probs``, cells expected < 5 pooled."""
  n = counts.sum()
  assert counts[probs == 0].sum() == 0  # nothing outside the support
  small = probs * n < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(probs[~small], probs[small].sum()) * n
  keep = exp > 0
  return stats.chisquare(obs[keep], exp[keep]).pvalue


STAT_SP = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=3, stop_ids=())
STAT_ROWS = 1 << 16
PROMPT = np.array([1, 2, 3, 1, 2, 3], np.int32)


@functools.lru_cache(maxsize=None)
def _stat_rollout(kind):
  return _spec(STAT_SP, DRAFTS[kind], PROMPT[None], np.ones((1, 6), np.int32), g=STAT_ROWS, key=3)


@pytest.mark.parametrize("kind", sorted(DRAFTS))
def test_sampled_rollouts_follow_the_policys_distribution(kind):
  """2^16 completions of 3 tokens (a group of one prompt) against the exact joint law of 512
  cells; the same statistic rejects a law with 1% of its mass moved (power check)."""
  r, st = _stat_rollout(kind)
  assert st["accepted"] > 0 and st["accepted"] < 3 * st["verifies"]  # accepts and rejects
  probs = _exact_joint(STAT_SP, PROMPT)
  cells = (r.tokens[:, 0] * V + r.tokens[:, 1]) * V + r.tokens[:, 2]
  counts = np.bincount(cells, minlength=V ** 3)
  assert _pooled_pvalue(counts, probs) > 1e-3
  shifted = probs.copy()
  first, second = np.argsort(-probs)[:2]  # the least detectable place: two large cells
  shifted[first] -= 0.01
  shifted[second] += 0.01
  draws = np.random.default_rng(0).multinomial(STAT_ROWS, shifted)
  assert _pooled_pvalue(draws, probs) < 1e-3


@pytest.mark.parametrize("kind", sorted(DRAFTS))
def test_recorded_logps_are_the_teacher_forced_forwards(kind):
  r, _ = _stat_rollout(kind)
  r = jax.tree.map(lambda x: x[:64], r)
  logits = _teacher_forced_logits(CFG, _params(), r)
  want = np.take_along_axis(_log_softmax(logits), r.tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(r.sampler_logp, want, atol=2e-5)
  with np.errstate(divide="ignore"):
    processed = np.log(np.stack([[_reference_probs(x, temperature=0.8, top_p=0.9) for x in row]
                               for row in logits]))
  want_draw = np.take_along_axis(processed, r.tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(r.draw_logp, want_draw, atol=2e-5)


def test_a_draft_equal_to_the_policy_is_always_accepted():
  sp = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=10, stop_ids=())
  r, st = _spec(sp, Draft("layers", tokens=3, layers=CFG.num_layers))
  assert st["accepted"] == 3 * st["verifies"] and (r.lengths == 10).all()
  logits = _teacher_forced_logits(CFG, _params(), r)  # 4 verifications' log-probs per row
  want = np.take_along_axis(_log_softmax(logits), r.tokens[..., None], -1)[..., 0]
  np.testing.assert_allclose(r.sampler_logp, want, atol=2e-5)


def test_engine_from_config_and_a_data_sharded_mesh():
  """``rollout.draft`` builds an all_rows engine that drafts; the sharded sampler (here one data
  shard) gives the unsharded rollout."""
  config = rljax.config(overrides={"rollout.draft": "ngram", "rollout.draft_tokens": 3,
                                   "rollout.draft_ngram": 2})
  check_config(config)
  engine = ROLLOUT_ENGINES.get("all_rows")(config, CFG, Placement())
  assert engine.draft == DRAFTS["ngram"]
  config_c = rljax.config(overrides={"rollout.engine": "continuous",
                                     "rollout.max_concurrent_rows": 2, "rollout.draft": "ngram",
                                     "rollout.draft_tokens": 3, "rollout.draft_ngram": 2})
  check_config(config_c)  # the continuous engine reads the draft keys
  assert ROLLOUT_ENGINES.get("continuous")(config_c, CFG, Placement()).draft == DRAFTS["ngram"]
  engine.load_weights(_params(), 0)
  got = engine.generate(TOKENS, MASK, jax.random.key(0), GREEDY, 2)
  want = jax.device_get(sample(CFG, _params(), TOKENS, MASK, jax.random.key(0), GREEDY, 2,
                               draft=DRAFTS["ngram"]))
  plain = jax.device_get(sample(CFG, _params(), TOKENS, MASK, jax.random.key(0), GREEDY, 2))
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.tokens, plain.tokens)
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  fn = sampler.make_sampler(CFG, GREEDY, 2, mesh=mesh, draft=DRAFTS["ngram"])
  sharded = jax.device_get(fn(_params(), TOKENS, MASK, jax.random.key(0)))
  np.testing.assert_array_equal(sharded.tokens, want.tokens)
  np.testing.assert_allclose(sharded.sampler_logp, want.sampler_logp, atol=1e-6)


@pytest.mark.parametrize("overrides, match", [
    ({"env.name": "guess", "env.engine": "async_turns", "reward.workers": 1,
      "reward.sources": "env:1"},
     r"env.engine='async_turns' decodes multi-turn episodes in its own loop .* or "
     r"rollout.draft='none'$"),
    ({"mesh.context": 2}, r"mesh.context=2 stripes it"),
    ({"model.router_replay": "R3"}, r"records no experts per token"),
    ({"rollout.draft": "none", "rollout.draft_tokens": 8}, r"speculative decoding is off"),
    ({"rollout.draft_layers": 2}, r"^rollout.draft_layers=2 is not used"),
])
def test_refusals_are_one_line(overrides, match):
  with pytest.raises(ConfigError, match=match) as err:
    check_config(rljax.config(overrides={"rollout.draft": "ngram", **overrides}))
  assert "\n" not in str(err.value)
  assert isinstance(err.value, UnusedKeyError) or "rollout.draft" in str(err.value)


def test_turn_synchronous_episodes_are_allowed():
  """Each turn of env.engine='turn_sync' is one call of the speculative rollout engine."""
  check_config(rljax.config(overrides={"rollout.draft": "ngram", "env.name": "guess",
                                       "reward.workers": 1, "reward.sources": "env:1"}))


def test_refusals_at_build_and_call():
  config = rljax.config(overrides={"rollout.draft": "layers", "rollout.draft_layers": 2})
  with pytest.raises(ValueError, match=r"^rollout.draft_layers=2: the draft must have fewer "
                                       r"layers than the policy's 2$"):
    ROLLOUT_ENGINES.get("all_rows")(config, CFG, Placement())
  with pytest.raises(ValueError, match=r"rollout.draft='none'"):
    Draft("none")

"""The multi-turn driver: token ids in, token ids out. A scripted ``generate`` (no model) pins the
record layout exactly; the real sampler on a tiny model checks that the trainer's forward, which
attends to environment tokens, reproduces the sampler's log-probs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax.data.tasks import make_task
from rljax.data.tokenizer import CharTokenizer
from rljax.config.table import get_config
from rljax.envs import ENVS, Environment, StepResult, register_env
from rljax.envs.episodes import (SOURCE_ENV, SOURCE_PAD, SOURCE_POLICY, EnvSettings, _row_bucket,
                                run_episodes, stop_ids)
from rljax.models import transformer
from rljax.rollout import sampler
from rljax.rollout.record import Rollout
from rljax.rollout.sampling import SamplingParams
from rljax.rollout.speculative import Draft
from rljax.learner import step as step_lib

TOK = CharTokenizer()
TALKER = "test_talker"

if TALKER not in ENVS:
  @register_env(TALKER)  # module level: the worker processes unpickle it by reference
  class Talker(Environment):
    """Answers every turn with an observation; the driver ends episodes at max_turns."""

    def reset(self, problem):
      return problem.prompt

    def step(self, action):
      return StepResult(f" {len(action)} ok:", 0.0, False, {})
SP = SamplingParams(temperature=1.0, max_new_tokens=16, stop_ids=(TOK.eos_id,), pad_id=TOK.pad_id)


class ScriptedPolicy:
  """``generate`` for the driver without a model: row ``j`` of a call continues its (unpadded)
  input with ``script(text, member)``'s ids, cut at the first stop id or ``max_new_tokens``.
  Every call is recorded as (input ids, output ids); sampled log-probs are -(k + 1) / 100."""

  def __init__(self, script, tokenizer=TOK):
    self.script, self.calls, self.tok = script, [], tokenizer

  def __call__(self, tokens, mask, key, sp, group_size):
    rows = [list(t[m > 0]) for t, m in zip(np.asarray(tokens), np.asarray(mask))]
    t = sp.max_new_tokens
    out = np.full((len(rows) * group_size, t), sp.pad_id, np.int32)
    lengths, truncated = [], []
    for j, ids in enumerate(rows):
      for member in range(group_size):
        new = self.tok.encode(self.script(self.tok.decode(ids), member))
        new += [self.tok.eos_id] if not new or new[-1] not in sp.stop_ids else []
        stop = next((k for k, i in enumerate(new) if i in sp.stop_ids), len(new) - 1)
        new = new[:min(stop + 1, t)]
        out[j * group_size + member, :len(new)] = new
        lengths.append(len(new))
        truncated.append(new[-1] not in sp.stop_ids)
        self.calls.append((ids, new))
    lengths = np.asarray(lengths, np.int32)
    logp = np.where(np.arange(t)[None] < lengths[:, None], -(np.arange(t)[None] + 1) / 100, 0)
    rep = lambda x: np.repeat(x, group_size, 0)
    return Rollout(prompt_tokens=rep(tokens), prompt_mask=rep(mask), tokens=out,
                   mask=(logp != 0).astype(np.int32), sampler_logp=logp.astype(np.float32),
                   draw_logp=logp.astype(np.float32), lengths=lengths,
                   truncated=np.asarray(truncated))


def calc_script(text, member):
  """Member 0 calls the calculator then copies its answer; member 1 answers 0 at once."""
  prompt, _, after = text.partition("=")
  if member == 1 and not after:
    return " #0"
  if not after:
    return f"<calc {prompt}>"
  return f" #{after.split('>')[-1]}"


def _settings(**kw):
  return EnvSettings(**{"name": "tool_calc", "max_turns": 3, "max_tokens": 40, "workers": 2,
                        **kw})


def test_token_in_token_out():
  problems = [make_task("tool_calc", 0).problem_at(0, i) for i in range(3)]
  policy = ScriptedPolicy(calc_script)
  result = run_episodes(problems, jax.random.PRNGKey(0), generate=policy, tokenizer=TOK,
                        settings=_settings(), sampling=SP, group_size=2, prompt_bucket=8)
  r = result.rollout
  assert r.tokens.shape == r.mask.shape == r.extras["source"].shape == (6, 40)
  sampled = {}  # input ids -> the ids sampled from them
  for ids, new in policy.calls:
    sampled.setdefault(tuple(ids), []).append(new)
  for row, problem in enumerate(p for p in problems for _ in range(2)):
    prompt = TOK.encode_prompt(problem.prompt)
    # The record's prompt is the first observation, left-padded, for both group members.
    assert list(r.prompt_tokens[row][r.prompt_mask[row] > 0]) == prompt
    source = r.extras["source"][row]
    n = int((source != SOURCE_PAD).sum())
    ids = list(r.tokens[row, :n])
    assert (source[n:] == SOURCE_PAD).all() and (r.tokens[row, n:] == TOK.pad_id).all()
    # Walk the trajectory: each policy run is exactly what was sampled from everything before
    # it (prompt, earlier samples, observations: never decoded and re-encoded), each environment
    # run exactly the encoded observation.
    pos, turns = 0, 0
    while pos < n:
      assert source[pos] == SOURCE_POLICY
      new = next(s for s in sampled[tuple(prompt + ids[:pos])] if ids[pos:pos + len(s)] == s)
      assert r.mask[row, pos:pos + len(new)].all()
      np.testing.assert_allclose(r.sampler_logp[row, pos:pos + len(new)],
                                 -(np.arange(len(new)) + 1) / 100, rtol=1e-6)
      pos += len(new)
      turns += 1
      end = pos
      while end < n and source[end] == SOURCE_ENV:
        end += 1
      if end > pos:
        call = TOK.decode(new)
        a, b = call[len("<calc "):-1].split("*")
        assert ids[pos:end] == TOK.encode(str(int(a) * int(b)))
        assert not r.mask[row, pos:end].any() and not r.sampler_logp[row, pos:end].any()
      pos = end
    assert r.mask[row].sum() == r.lengths[row] == (source == SOURCE_POLICY).sum()
    episode = result.episodes[row]
    assert episode.turns == turns == (2 if row % 2 == 0 else 1)
    assert episode.end == "done" and episode.correct == (row % 2 == 0)
    assert r.rewards[row] == float(row % 2 == 0) == sum(episode.turn_rewards)
    assert result.transcripts[row] == TOK.decode(ids)
  np.testing.assert_array_equal(r.extras["env_tool_calls"], [1, 0] * 3)
  assert result.counts["env/turns"] == 9 and result.counts["env/tool_calls"] == 3
  assert result.counts["env/episodes"] == 6 and result.counts["env/errors"] == 0


def test_limits_turns_and_tokens():
  problems = [make_task("tool_calc", 0).problem_at(0, 0)]
  forever = ScriptedPolicy(lambda text, member: "<calc 1+1>")  # never answers
  result = run_episodes(problems, jax.random.PRNGKey(0), generate=forever, tokenizer=TOK,
                        settings=_settings(max_turns=2, max_tokens=40), sampling=SP,
                        group_size=1, prompt_bucket=8)
  (episode,) = result.episodes
  assert (episode.end, episode.turns, episode.truncated) == ("max_turns", 2, False)
  assert result.rollout.rewards[0] == 0 and result.counts["env/max_turns"] == 1
  # A budget of 25 tokens: two calls of 10 tokens and their answers (1 each) leave 3 tokens for
  # the third call, which is cut there.
  result = run_episodes(problems, jax.random.PRNGKey(0), generate=forever, tokenizer=TOK,
                        settings=_settings(max_turns=5, max_tokens=25), sampling=SP,
                        group_size=1, prompt_bucket=8)
  (episode,) = result.episodes
  assert (episode.end, episode.turns, episode.truncated) == ("max_tokens", 2, True)
  assert len(episode.ids) == 25 and TOK.decode(episode.ids).endswith("2<ca")
  assert result.rollout.truncated[0] and result.rollout.mask[0].sum() == 23


def test_hermes_calls_with_a_hugging_face_tokenizer(tmp_path):
  """Hermes tool calls where ``<tool_call>`` / ``</tool_call>`` are special tokens of a Hugging
  Face tokenizer: the turn stops at the close token, the environment reads the call (special
  tokens kept, EOS dropped) and its ``<tool_response>`` is encoded and appended."""
  from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  from rljax.data.tasks import Problem
  from rljax.data.tokenizer import load_tokenizer
  specials = ["<pad>", "<eos>", "<bos>", "<tool_call>", "</tool_call>"]
  bpe = Tokenizer(tok_models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  bpe.train_from_iterator(['{"name": "calc", "arguments": {"expression": "2*21"}} #42'] * 10,
                          trainer)
  PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>",
                          bos_token="<bos>").save_pretrained(str(tmp_path))
  tok = load_tokenizer(str(tmp_path))
  call = '<tool_call>{"name": "calc", "arguments": {"expression": "2*21"}}</tool_call>'
  assert tok.encode("</tool_call>") == [4]

  def script(text, member):
    return call if "<tool_response>" not in text else " #42"
  policy = ScriptedPolicy(script, tok)
  sp = dataclasses.replace(SP, max_new_tokens=64, stop_ids=(tok.eos_id,), pad_id=tok.pad_id)
  result = run_episodes([Problem("what is 2*21?", "42")], jax.random.PRNGKey(0),
                        generate=policy, tokenizer=tok,
                        settings=_settings(tool_format="hermes", max_tokens=96), sampling=sp,
                        group_size=1, prompt_bucket=8)
  (episode,) = result.episodes
  assert (episode.end, episode.correct, episode.turns, episode.tool_calls) == ("done", True, 2, 1)
  source = np.asarray(episode.source)
  observation = [i for i, s in zip(episode.ids, source) if s == SOURCE_ENV]
  assert observation == tok.encode("<tool_response>\n42\n</tool_response>\n")
  policy_ids = [i for i, s in zip(episode.ids, source) if s == SOURCE_POLICY]
  assert policy_ids == tok.encode(call) + tok.encode(" #42") + [tok.eos_id]


def test_stop_ids_and_row_buckets():
  assert stop_ids(TOK, SP, "compact") == (TOK.eos_id, TOK.encode(">")[0])
  assert [_row_bucket(n, 64, 1) for n in (64, 33, 32, 9, 8, 1)] == [64, 64, 32, 16, 8, 8]
  assert _row_bucket(3, 12, 2) == 6 and _row_bucket(1, 8, 4) == 4


def tiny_model_config():
  """A 1-layer model of the char tokenizer's vocabulary (the multi-turn tests' policy)."""
  c = get_config()
  for key, value in dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                         num_kv_heads=1).items():
    c.model[key] = value
  return models.tiny_config(c.model, TOK.vocab_size, eos_token_id=TOK.eos_id,
                            pad_token_id=TOK.pad_id)


@pytest.mark.parametrize("draft", [None, Draft("ngram", tokens=3, ngram=2)],
                         ids=["plain", "speculative"])
def test_sequence_inputs_attends_to_environment_tokens(draft):
  """The trainer's forward over a multi-turn record reproduces the sampler's log-probs of the
  policy tokens (float32): it sees the observations. Without ``source`` (the observations
  masked out of the attention) the policy tokens after them get other log-probs. With
  speculative decoding (``draft``: each turn's call verifies prompt-lookup drafts) the recorded
  log-probs are the same teacher-forced forward's."""
  cfg = tiny_model_config()
  params = transformer.init_params(cfg, seed=0)

  def generate(tokens, mask, key, sp, group_size):
    return jax.tree.map(np.asarray, sampler.sample(cfg, params, tokens, mask, key, sp,
                                                   group_size, draft=draft))
  problems = [make_task("guess", 0).problem_at(0, i) for i in range(2)]
  # Two turns of at most 4 tokens around one observation: every call is 32 wide (2 compiles).
  sp = dataclasses.replace(SP, max_new_tokens=4)
  result = run_episodes(problems, jax.random.PRNGKey(3), generate=generate, tokenizer=TOK,
                        settings=_settings(name=TALKER, max_turns=2, max_tokens=16),
                        sampling=sp, group_size=4, prompt_bucket=32)
  r = result.rollout
  source = r.extras["source"]
  assert (source == SOURCE_ENV).any(axis=1).all()
  tokens, attn = step_lib.sequence_inputs(r)
  np.testing.assert_array_equal(attn[:, r.prompt_tokens.shape[1]:], source > 0)
  stats = jax.jit(lambda rollout: step_lib.completion_stats(cfg, params, rollout, chunk=64)[0])
  logp = stats(r)
  mask = r.mask > 0
  np.testing.assert_allclose(np.where(mask, logp, 0), r.sampler_logp, atol=1e-4)
  blind = r.replace(extras={})  # the single-turn layout: attention = prompt + policy tokens
  _, blind_attn = step_lib.sequence_inputs(blind)
  np.testing.assert_array_equal(blind_attn[:, r.prompt_tokens.shape[1]:], r.mask)
  blind_logp = stats(blind)
  after_env = mask & (np.cumsum(source == SOURCE_ENV, axis=1) > 0)
  assert np.abs(np.asarray(blind_logp) - np.asarray(logp))[after_env].max() > 1e-3


def test_greedy_speculative_turns_are_the_plain_turns():
  """env.engine='turn_sync' with speculative decoding: greedy episodes (two turns around an
  observation) have the plain sampler's ids, sources and log-probs."""
  cfg = tiny_model_config()
  params = transformer.init_params(cfg, seed=0)
  sp = dataclasses.replace(SP, greedy=True, max_new_tokens=4)
  problems = [make_task("guess", 0).problem_at(0, i) for i in range(2)]

  def episodes(draft):
    def generate(tokens, mask, key, sp, group_size):
      return jax.tree.map(np.asarray, sampler.sample(cfg, params, tokens, mask, key, sp,
                                                     group_size, draft=draft))
    return run_episodes(problems, jax.random.PRNGKey(3), generate=generate, tokenizer=TOK,
                        settings=_settings(name=TALKER, max_turns=2, max_tokens=16),
                        sampling=sp, group_size=2, prompt_bucket=32).rollout
  plain, spec = episodes(None), episodes(Draft("ngram", tokens=3, ngram=2))
  assert (plain.extras["source"] == SOURCE_ENV).any()
  for name in ("tokens", "mask", "lengths"):
    np.testing.assert_array_equal(getattr(spec, name), getattr(plain, name), err_msg=name)
  np.testing.assert_array_equal(spec.extras["source"], plain.extras["source"])
  np.testing.assert_allclose(spec.sampler_logp, plain.sampler_logp, atol=1e-5)

"""The SFT cold start's exact-match check and the stop it drives (``sft.stop_match``)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import loader as config_loader
from rljax.data import tokenizer as tokenizer_lib
from rljax.models import transformer
from rljax.models.config import ModelConfig
from rljax.train import sft

from . import tiny

PROMPT, NEW = 4, 5


def _greedy_continuations(model_cfg, params, prompts: list) -> list:
  """Greedy decoding by its definition: a full forward per new token, the argmax of the last
  (the rows decoded side by side: a row's forward does not see the others)."""
  last_logits = jax.jit(lambda params, tokens: _last_logits(model_cfg, params, tokens))
  ids = np.asarray(prompts, np.int32)
  for _ in range(NEW):
    ids = np.concatenate([ids, np.asarray(last_logits(params, ids)).argmax(-1)[:, None]], axis=1)
  return ids[:, len(prompts[0]):].tolist()


def _last_logits(model_cfg, params, tokens):
  hidden, model, _ = transformer.forward_with_routes(model_cfg, params, tokens,
                                                     jnp.ones_like(tokens))
  return hidden[:, -1] @ model.head_weight()


def test_exact_match_is_the_share_of_rows_that_greedy_decoding_writes():
  model_cfg = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16)
  params = jax.jit(lambda: transformer.init_params(model_cfg, seed=3))()
  rng = np.random.default_rng(0)
  prompts = [[int(t) for t in rng.integers(1, 16, size=PROMPT)] for _ in range(4)]
  rows = [p + c for p, c in zip(prompts, _greedy_continuations(model_cfg, params, prompts))]
  learn = np.zeros((4, PROMPT + NEW), np.float32)
  learn[:, PROMPT:] = 1
  # Rows 1 and 3: a learned token that greedy decoding would not write -> not matched.
  rows[1][PROMPT] = (rows[1][PROMPT] + 1) % 16
  rows[3][-1] = (rows[3][-1] + 1) % 16
  # Row 2: the same change on a token that is not learned (mask 0) -> still matched.
  rows[2][-1] = (rows[2][-1] + 1) % 16
  learn[2, -1] = 0
  tokens = jnp.asarray(rows, jnp.int32)
  # Jitted, as the SFT loop calls it (eagerly each op would compile on its own).
  rate = jax.jit(functools.partial(sft.exact_match, model_cfg))(
      params, tokens, jnp.ones_like(tokens), jnp.asarray(learn))
  assert float(rate) == 0.5


def test_sampled_match_is_the_mean_probability_that_sampling_writes_the_learned_tokens():
  # Reference: the chain rule by its definition, one full forward per prefix, softmax in NumPy,
  # the product over the learned positions only (row 1's second token is given, not learned, as
  # an observation is).
  model_cfg = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16)
  params = jax.jit(lambda: transformer.init_params(model_cfg, seed=5))()
  rng = np.random.default_rng(1)
  rows = rng.integers(1, 16, size=(3, PROMPT + NEW)).astype(np.int32)
  learn = np.zeros(rows.shape, np.float32)
  learn[:, PROMPT:] = 1
  learn[1, PROMPT + 1] = 0
  last_logits = jax.jit(lambda params, tokens: _last_logits(model_cfg, params, tokens))
  want = []
  for r in range(3):
    prob = 1.0
    for t in range(PROMPT, PROMPT + NEW):
      logits = np.asarray(last_logits(params, rows[r:r + 1, :t]), np.float64)[0]
      p = np.exp(logits - logits.max())
      prob *= (p / p.sum())[rows[r, t]] if learn[r, t] else 1.0
    want.append(prob)
  tokens = jnp.asarray(rows)
  got = jax.jit(functools.partial(sft.sampled_match, model_cfg))(
      params, tokens, jnp.ones_like(tokens), jnp.asarray(learn))
  np.testing.assert_allclose(float(got), np.mean(want), rtol=1e-4)


def _config(tmp_path, **overrides):
  args = tiny.args("main", str(tmp_path / "run"),
                   {"sft.out_dir": str(tmp_path / "sft"), **{k: str(v) for k, v in
                                                             overrides.items()}})
  path, parsed, _ = config_loader.split_config_args(args[1:])
  return config_loader.load_config(path, parsed)


@pytest.mark.parametrize("stop_match,stopped_at,stop_on", [(0.5, 30, "greedy"),
                                                           (0.95, None, "greedy"),
                                                           (0.5, 30, "sampled")])
def test_sft_stops_at_the_first_check_that_reaches_stop_match(tmp_path, monkeypatch, stop_match,
                                                                stopped_at, stop_on):
  config = _config(tmp_path, **{"sft.steps": 40, "sft.warmup_steps": 10, "sft.stop_match": stop_match,
                                "sft.stop_on": stop_on,
                                "sft.check_every": 10, "sft.check_size": 4,
                                "rollout.max_new_tokens": 24})
  rates = iter([0.1, 0.3, 0.6, 0.9, 0.9])
  checked = []

  def scripted(model_cfg, params, tokens, attn, loss_mask):
    # Called under jit: the rate and the record come from a host callback at every check.
    def host():
      checked.append(tokens.shape[0])
      return np.float32(next(rates))
    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32))

  # The check sft.stop_on names is scripted; the other fails the test if it is called.
  unused = "sampled_match" if stop_on == "greedy" else "exact_match"
  monkeypatch.setattr(sft, "exact_match" if stop_on == "greedy" else "sampled_match", scripted)
  monkeypatch.setattr(sft, unused, lambda *a: pytest.fail(f"{unused} called"))
  lines = []
  sft.train_sft(config, tokenizer_lib.load_tokenizer("char"), log=lines.append)
  if stopped_at is None:  # never reached: all 40 steps, then the final rate is reported
    assert checked == [4] * 5
    assert lines[-1] == "sft ran all 40 steps: exact match 0.900 < sft.stop_match 0.95"
  else:
    assert checked == [4] * 3  # steps 10, 20, 30
    what = "exact match" if stop_on == "greedy" else "sampled match"
    assert lines[-1].startswith(f"sft stopped at step {stopped_at}: {what} 0.600")


class _Drawn(Exception):
  pass


def test_the_cold_start_is_initialised_from_sft_seed_not_the_run_seed(tmp_path, monkeypatch):
  # The stamp leaves the run's seed out (one cold start for a study's seeds): the init must not
  # read it either, or the saved cold start would be of whichever seed trained it first.
  drawn = []

  def init_params(model_cfg, seed):
    drawn.append(seed)
    raise _Drawn

  monkeypatch.setattr(sft.transformer, "init_params", init_params)
  for seed in (0, 5):
    with pytest.raises(_Drawn):
      sft.train_sft(_config(tmp_path, **{"seed": seed, "sft.seed": 77}),
                    tokenizer_lib.load_tokenizer("char"))
  assert drawn == [77, 77]

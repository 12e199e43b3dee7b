"""Data errors name file and line; prompts longer than the limit are refused or dropped (counted)
at start-up, before any model is built: a 1 MB prompt never reaches the sampler."""
import json
import time

import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.data import datasets, prompt_policy, tokenizer as tokenizer_lib
from rljax.data.tasks import is_eval_prompt
from rljax.train import policy
from tests.train import tiny


def _write(path, prompts):
  with open(path, "w") as f:
    for p in prompts:
      f.write(json.dumps({"prompt": p, "answer": "1"}) + "\n")
  return str(path)


def _prompts(n):
  return [f"{i}+{i}=" for i in range(n)]


@pytest.fixture
def no_model(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("the policy was loaded before the prompts were checked")
  monkeypatch.setattr(policy, "load_policy", refuse)


def test_megabyte_prompt_is_refused_at_start_up_naming_file_and_line(tmp_path, no_model):
  path = _write(tmp_path / "d.jsonl", _prompts(40)[:7] + ["1+" * 500_000] + _prompts(40)[7:])
  start = time.monotonic()
  with pytest.raises(prompt_policy.PromptTooLongError,
                     match=rf"d.jsonl:8: prompt of 1000001 tokens exceeds the limit of 4088"):
    cli.main(tiny.args("grpo", str(tmp_path / "run"), {"data.source": f"jsonl:{path}"}))
  assert time.monotonic() - start < 10


def test_drop_policy_counts_and_never_yields_long_prompts(tmp_path):
  prompts = _prompts(60) + ["9" * 50, "8" * 40]
  path = _write(tmp_path / "d.jsonl", prompts)
  config = config_loader.load_config(
      f"{tiny.ROOT}/configs/base.py",
      [("data.source", f"jsonl:{path}"), ("data.max_prompt_tokens", "20"),
       ("data.overlong_prompts", "drop")])
  tok = tokenizer_lib.load_tokenizer("char", False)
  source = datasets.make_prompt_source(config.data)
  logged = []
  assert prompt_policy.apply_prompt_policy(source, config, tok, log=logged.append) == 2
  assert "left out 2 prompts longer than 20 tokens" in logged[0]
  seen = source.next_batch(200) + source.eval_set(100)
  assert max(len(tok.encode_prompt(p.prompt)) for p in seen) <= 20
  kept = {p for p in prompts if len(p) < 20}
  assert {p.prompt for p in seen} == kept


def test_embedded_prompts_checked_as_drawn():
  config = config_loader.load_config(f"{tiny.ROOT}/configs/base.py",
                                     [("data.max_prompt_tokens", "9")])
  tok = tokenizer_lib.load_tokenizer("char", False)
  source = datasets.make_prompt_source(config.data)
  prompt_policy.apply_prompt_policy(source, config, tok)
  with pytest.raises(prompt_policy.PromptTooLongError, match="exceeds the limit of 9"):
    source.next_batch(50)
  with config.unlocked():
    config.data.overlong_prompts = "drop"
  source = datasets.make_prompt_source(config.data)
  prompt_policy.apply_prompt_policy(source, config, tok)
  batch = source.next_batch(5)
  assert all(len(tok.encode_prompt(p.prompt)) <= 9 for p in batch)
  assert source.dropped_prompts == source.position - 5 > 0


def test_context_leaves_room_for_new_tokens():
  assert prompt_policy.prompt_token_limit(0, 4096, 64) == 4032
  assert prompt_policy.prompt_token_limit(100, 4096, 64) == 100
  with pytest.raises(ValueError, match="leaves no room"):
    prompt_policy.prompt_token_limit(0, 64, 64)


def test_multi_turn_budget_is_env_max_tokens():
  """A multi-turn episode holds every turn and observation after the prompt: the prompt limit
  leaves env.max_tokens positions of the context, and the errors name that key."""
  config = config_loader.load_config(f"{tiny.ROOT}/configs/tasks/guess.py")
  tok = tokenizer_lib.load_tokenizer(config.data.tokenizer, False)
  context = prompt_policy.model_context(config, tok)
  assert prompt_policy.completion_budget(config) == (config.env.max_tokens, "env.max_tokens")
  with config.unlocked():
    config.env.max_tokens = context - 3  # rollout.max_new_tokens stays far below the context
  source = datasets.make_prompt_source(config.data)
  prompt_policy.apply_prompt_policy(source, config, tok)
  with pytest.raises(prompt_policy.PromptTooLongError,
                     match="limit of 3 .*context minus env.max_tokens"):
    source.next_batch(4)
  with config.unlocked():
    config.env.max_tokens = context
  with pytest.raises(prompt_policy.ContextError, match=f"env.max_tokens={context} leaves no room"):
    prompt_policy.apply_prompt_policy(datasets.make_prompt_source(config.data), config, tok)


def test_non_utf8_bytes_name_file_and_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "\xff\xfe", "answer": "2"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2: not UTF-8 text \(byte 0xff at column 13\)"):
    datasets.read_jsonl(str(path))


def test_no_eval_rows_message_names_no_unsettable_option(tmp_path):
  prompts = [p for p in _prompts(200) if not is_eval_prompt(p)][:5]
  source = datasets.PromptSource(f"jsonl:{_write(tmp_path / 'd.jsonl', prompts)}")
  with pytest.raises(ValueError) as info:
    source.eval_set(4)
  assert "eval_source" not in str(info.value) and "needs more rows" in str(info.value)

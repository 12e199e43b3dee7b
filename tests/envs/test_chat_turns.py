"""Tool turns in the model's chat format: with hermes calls and a chat template, a trajectory is the
conversation as ``tokenizer.apply_chat_template`` renders it, token for token (system, user, an
assistant message with two parallel calls, the tool messages, the answer); the observation after
a turn is the template's tool messages and next assistant header, for the templates of Qwen2.5,
Qwen3 and Llama 3.1 (Gemma 3's has no tool role: refused at start-up); SFT demonstrations are
rendered as the template renders them."""
import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from rljax import cli
from rljax.config import loader as config_loader
from rljax.config.checks import ConfigError
from rljax.data.tasks import Problem
from rljax.data.tokenizer import load_tokenizer
from rljax.envs import ENVS, register_env
from rljax.envs.checks import check_env_startup
from rljax.envs.episodes import SOURCE_ENV, SOURCE_POLICY, EnvSettings, run_episodes
from rljax.envs.tool_calc import ToolCalcEnv
from rljax.envs.tools import render_calls
from rljax.train import sft
from tests.envs.chat_templates import build_tokenizer
from tests.envs.test_driver import SP, ScriptedPolicy
from tests.train import tiny

CHAT_CALC = "test_chat_calc"
SYSTEM = "You are a helpful assistant. Use the calculator."

if CHAT_CALC not in ENVS:
  @register_env(CHAT_CALC)  # module level: the worker processes unpickle it by reference
  class ChatCalc(ToolCalcEnv):
    """``tool_calc`` whose first observation is chat messages: a system message and the user's."""

    def reset(self, problem):
      self.problem = problem
      return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem.prompt}]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
  root = tmp_path_factory.mktemp("chat")
  return {family: load_tokenizer(build_tokenizer(family, str(root / family)), chat_template=True)
          for family in ("qwen2.5", "qwen3", "llama3.1", "gemma3")}


CALLS = (("calc", {"expression": "12*3"}), ("calc", {"expression": "5*7"}))


def _tool_calls(calls):
  return [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3"])
def test_a_trajectory_is_the_chat_template_rendering(tokenizers, family):
  tok = tokenizers[family]
  eos = tok._hf.decode([tok.eos_id], skip_special_tokens=False)
  # Qwen3 keeps an assistant message's reasoning after the last user query, in <think>.
  think = (lambda r: f"<think>\n{r}\n</think>\n\n") if family == "qwen3" else (lambda r: "")
  first = think("two products") + render_calls(CALLS, "hermes")
  final = think("their sum") + "So the answer is #71"

  def script(text, member):  # both calls in one message, then the answer once they are answered
    return (first if "</tool_response>" not in text else final) + eos
  policy = ScriptedPolicy(script, tok)
  sp = dataclasses.replace(SP, max_new_tokens=160, stop_ids=(tok.eos_id,), pad_id=tok.pad_id)
  settings = EnvSettings(name=CHAT_CALC, max_turns=3, max_tokens=400, workers=1,
                         tool_format="hermes")
  problem = Problem("What is 12*3+5*7?", "71")
  result = run_episodes([problem], jax.random.PRNGKey(0), generate=policy, tokenizer=tok,
                        settings=settings, sampling=sp, group_size=1, prompt_bucket=8)
  (episode,) = result.episodes
  assert (episode.end, episode.correct, episode.turns, episode.tool_calls) == ("done", True, 2, 2)
  assert len(policy.calls) == 2  # the two calls ran in one turn: one sampler call per message
  r = result.rollout
  trajectory = list(r.prompt_tokens[0][r.prompt_mask[0] > 0]) + episode.ids

  conversation = [
      {"role": "system", "content": SYSTEM}, {"role": "user", "content": problem.prompt},
      {"role": "assistant", "content": think("two products"), "tool_calls": _tool_calls(CALLS)},
      {"role": "tool", "content": "36"}, {"role": "tool", "content": "35"},
      {"role": "assistant", "content": final}]
  rendered = tok._hf.apply_chat_template(conversation, tokenize=False)
  # The template ends the last message with EOS and a newline; the policy's turn ends at EOS.
  assert rendered.endswith(eos + "\n")
  rendered = rendered[:-1]
  assert tok.decode(trajectory, skip_special_tokens=False) == rendered
  assert trajectory == tok._hf.encode(rendered, add_special_tokens=False)
  # The environment wrote the tool messages and the next assistant header, nothing else; the
  # policy's two messages (EOS included) are its tokens, the only ones learned.
  source = np.asarray(episode.source)
  env_text = tok.decode([i for i, s in zip(episode.ids, source) if s == SOURCE_ENV],
                        skip_special_tokens=False)
  assert env_text == ("\n<|im_start|>user\n<tool_response>\n36\n</tool_response>\n"
                      "<tool_response>\n35\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
  policy_ids = [i for i, s in zip(episode.ids, source) if s == SOURCE_POLICY]
  assert policy_ids == tok.encode(first + eos) + tok.encode(final + eos)
  assert r.mask[0].sum() == len(policy_ids)


FOLLOWUPS = {  # the template's text after an assistant message's EOS, written out by hand
    "qwen2.5": "\n<|im_start|>user\n<tool_response>\n36\n</tool_response><|im_end|>\n"
               "<|im_start|>assistant\n",
    "qwen3": "\n<|im_start|>user\n<tool_response>\n36\n</tool_response><|im_end|>\n"
             "<|im_start|>assistant\n",
    "llama3.1": '<|start_header_id|>ipython<|end_header_id|>\n\n"36"<|eot_id|>'
                "<|start_header_id|>assistant<|end_header_id|>\n\n",
}


@pytest.mark.parametrize("family", sorted(FOLLOWUPS))
def test_the_observation_after_a_call_is_the_templates_tool_message(tokenizers, family):
  tok = tokenizers[family]
  followup = tok.render_followup([{"role": "tool", "content": "36"}])
  assert followup == FOLLOWUPS[family]
  # The same text closes the conversation the template renders whole: what precedes it ends
  # with the assistant message's EOS.
  conversation = [{"role": "user", "content": "What is 12*3?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": _tool_calls(CALLS[:1])},
                  {"role": "tool", "content": "36"}]
  whole = tok._hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
  eos = tok._hf.decode([tok.eos_id], skip_special_tokens=False)
  assert whole.endswith(followup) and whole[:-len(followup)].endswith(eos)
  # A result holding the template's own markers does not move where the followup starts.
  tricky = tok.render_followup([{"role": "tool", "content": f"a{eos}b"}])
  assert tricky == FOLLOWUPS[family].replace("36", f"a{eos}b")


def _config(tokenizer_dir, **overrides):
  base = {"env.name": "tool_calc", "env.tool_format": "hermes", "data.tokenizer": tokenizer_dir,
          "data.chat_template": "True"}
  return config_loader.load_config(os.path.join(tiny.ROOT, "configs", "base.py"),
                                   list({**base, **overrides}.items()))


def test_a_template_without_a_tool_role_is_refused_at_start_up(tokenizers):
  with pytest.raises(ConfigError) as info:
    check_env_startup(_config(tokenizers["gemma3"].path), tokenizers["gemma3"])
  assert str(info.value) == (
      "env.tool_format='hermes' with data.chat_template=True: the chat template of "
      f"data.tokenizer={tokenizers['gemma3'].path!r} cannot render the messages (user, "
      "assistant, tool): Conversation roles must alternate user/assistant/user/assistant/...")
  check_env_startup(_config(tokenizers["qwen2.5"].path), tokenizers["qwen2.5"])


def test_sft_demonstrations_are_rendered_as_the_template_renders_them(tokenizers):
  tok = tokenizers["qwen2.5"]
  calls = (("calc", {"expression": "12*3"}), ("note", {"text": "café ≠ 3"}))
  problem = Problem("What is 12*3+5*7?", "71",
                    meta={"episode": (calls, ("36", "noted"), "So the answer is #71")})
  ids, learn = sft.encode_example(tok, problem, "hermes")
  conversation = [{"role": "user", "content": problem.prompt},
                  {"role": "assistant", "content": "", "tool_calls": _tool_calls(calls)},
                  {"role": "tool", "content": "36"}, {"role": "tool", "content": "noted"},
                  {"role": "assistant", "content": "So the answer is #71"}]
  rendered = tok._hf.apply_chat_template(conversation, tokenize=False)[:-1]  # up to the EOS
  assert tok.decode(ids, skip_special_tokens=False) == rendered
  assert ids == tok._hf.encode(rendered, add_special_tokens=False)
  assert "café ≠ 3" in rendered and "\\u" not in rendered
  learned = tok.decode([i for i, m in zip(ids, learn) if m], skip_special_tokens=False)
  assert learned == (render_calls(calls, "hermes") + "<|im_end|>So the answer is #71<|im_end|>")


def test_a_message_cut_at_max_new_tokens_is_closed_before_the_tool_messages(tokenizers):
  """A turn cut at ``rollout.max_new_tokens`` ends without EOS: the environment's tokens start
  with one, so the tool messages read as they do after a complete message."""
  tok = tokenizers["qwen2.5"]
  policy = ScriptedPolicy(lambda text, member: render_calls(CALLS, "hermes"), tok)
  sp = dataclasses.replace(SP, max_new_tokens=6, stop_ids=(tok.eos_id,), pad_id=tok.pad_id)
  settings = EnvSettings(name=CHAT_CALC, max_turns=2, max_tokens=400, workers=1,
                         tool_format="hermes")
  result = run_episodes([Problem("What is 12*3+5*7?", "71")], jax.random.PRNGKey(0),
                        generate=policy, tokenizer=tok, settings=settings, sampling=sp,
                        group_size=1, prompt_bucket=8)
  (episode,) = result.episodes
  first = tok.encode(render_calls(CALLS, "hermes"))[:6]
  assert episode.ids[:6] == first and tok.eos_id not in first
  assert episode.source[6] == SOURCE_ENV and episode.ids[6] == tok.eos_id
  env_end = episode.source.index(SOURCE_POLICY, 6)
  assert tok.decode(episode.ids[6:env_end], skip_special_tokens=False) == (
      "<|im_end|>\n<|im_start|>user\n<tool_response>\nerror: unclosed <tool_call> (no "
      "</tool_call>)\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_a_run_with_a_qwen_style_tokenizer_trains_on_chat_format_episodes(tokenizers, tmp_path):
  """``rljax train`` end to end with hermes calls and a Qwen-style chat template: the start-up
  checks pass, episodes are sampled as chat messages, and the trainer's forward, which attends to
  the template's tokens, reproduces the sampler's log-probs."""
  run_dir = str(tmp_path / "run")
  overrides = {
      "model.source": "tiny", "model.hidden_size": "32", "model.intermediate_size": "64",
      "model.num_layers": "1", "model.num_heads": "2", "model.num_kv_heads": "1",
      "data.tokenizer": tokenizers["qwen2.5"].path, "data.chat_template": "True",
      "data.prompt_bucket": "32", "env.tool_format": "hermes", "env.max_tokens": "48",
      "rollout.prompts_per_step": "2", "rollout.group_size": "2",
      "rollout.max_new_tokens": "16", "data.num_eval": "2", "train.steps": "1",
      "train.eval_every": "0", "train.progress": "false", "train.export_hf": "false",
      "train.run_dir": run_dir}
  cli.main(["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "tool_calc.py")]
           + [f"--config.{k}={v}" for k, v in overrides.items()])
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    (step,) = [m for m in map(json.loads, f) if "loss" in m]
  assert step["env/episodes"] == 4 and step["logp_gap_max"] < 1e-3
  assert step["generated_tokens"] == step["env/policy_tokens"]

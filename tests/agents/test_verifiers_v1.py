"""A verifiers v1 environment end to end: the library's own example environment ``reverse_text``
(``tests/agents/vf1_envs``), run by ``verifiers==0.4.0`` in its own environment
(``.venv-verifiers``, made by scripts/bootstrap.sh) behind the bridge
(``rljax/agents/verifiers_v1_bridge.py``), its harness program (the library's ``null`` chat
harness, a ``uv`` script in the ``subprocess`` runtime) calling the model at an episode's
endpoint URL. The reward is the taskset's, the LCS ratio of the text in ``<reversed_text>`` tags
against the reversed prompt, recomputed here with ``difflib`` from the answer the model wrote.
And ``configs/tasks/verifiers.py``, GRPO on the v1 taskset rljax ships (``reverse_letters``), one
step through ``rljax train``."""
import dataclasses
import difflib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jax
import numpy as np
import pytest
from transformers import AutoTokenizer

from rljax import cli
from rljax.agents import driver as driver_lib
from rljax.agents import harness as harness_lib
from rljax.agents.harness import AgentTask, register_harness
from rljax.agents.verifiers_v1 import BridgeError, free_port, verifiers_v1_harness
from rljax.data.tasks import Problem
from rljax.data.tokenizer import load_tokenizer
from rljax.envs.episodes import EnvSettings
from rljax.errors import StartupError
from rljax.models import transformer
from rljax.rollout.engines import JaxEngine
from tests.envs.chat_templates import build_tokenizer
from tests.envs.test_driver import SP, tiny_model_config
from tests.train import tiny

PYTHON = os.path.join(tiny.ROOT, ".venv-verifiers", "bin", "python")
ENVS = os.path.join(os.path.dirname(__file__), "vf1_envs")
# reverse_text's system prompt (tests/agents/vf1_envs/reverse_text/taskset.py), as the library
# sends it: the first message of every call.
SYSTEM = "Reverse the text character-by-character. Put your answer in <reversed_text> tags."
TAG = re.compile(r"<reversed_text>(.*?)</reversed_text>", re.DOTALL)


def lcs_reward(reply: str, answer: str) -> float:
  """The taskset's reward, written again: the tagged text's SequenceMatcher ratio."""
  match = TAG.search(reply or "")
  return difflib.SequenceMatcher(None, match.group(1).strip() if match else "", answer).ratio()


def _task_data(problem):
  return {"prompt": problem.prompt, "system_prompt": SYSTEM, "answer": problem.prompt[::-1]}


@pytest.fixture(scope="module")
def harness():
  assert os.path.exists(PYTHON), "run scripts/bootstrap.sh (it makes .venv-verifiers)"
  play = verifiers_v1_harness(taskset="reverse_text", python=PYTHON, port=free_port(),
                              task_data=_task_data, python_path=ENVS, timeout_s=300.0)
  play.prepare()
  try:
    yield play
  finally:
    play.close()


class _Scripted(BaseHTTPRequestHandler):
  """An OpenAI chat endpoint whose answer is ``REPLIES[user message]``, streamed as the library
  asks (one content delta, then the finish); it records each request's body."""
  REPLIES, BODIES = {}, []

  def log_message(self, *args):
    pass

  def do_POST(self):
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    self.BODIES.append(body)
    text = self.REPLIES[body["messages"][-1]["content"]]
    chunk = lambda delta, finish: {"id": "x", "object": "chat.completion.chunk", "created": 0,
                                   "model": body["model"], "choices": [
                                       {"index": 0, "delta": delta, "finish_reason": finish}]}
    events = [chunk({"role": "assistant", "content": text}, None), chunk({}, "stop")]
    data = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def test_the_bridge_returns_the_taskset_reward_of_the_models_answer(harness):
  server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  _Scripted.REPLIES.update({
      "hello world": "<reversed_text>dlrow olleh</reversed_text>",  # right: 1.0
      "abcdef": "I think <reversed_text>fedxba</reversed_text>",  # partly right
      "rljax": "xajlr"})  # no tags: 0.0
  url = f"http://127.0.0.1:{server.server_address[1]}/e/episode7/v1"
  try:
    for prompt, reply in _Scripted.REPLIES.items():
      out = harness(AgentTask(url, "key", "rljax-policy", Problem(prompt, "")))
      assert out["reward"] == pytest.approx(lcs_reward(reply, prompt[::-1]))
      assert out["info"] == {"last_reply": reply, "turns": 1}
    # One call an episode (the taskset stops after one turn), the library's messages.
    assert [b["messages"] for b in _Scripted.BODIES] == [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}]
        for p in _Scripted.REPLIES]
    assert all(b["stream"] and b["model"] == "rljax-policy" for b in _Scripted.BODIES)
  finally:
    server.shutdown()


def test_a_failed_episode_is_an_error_not_a_zero_reward(harness):
  # Nothing listens at the model's URL: the library records a provider error on the trace.
  with pytest.raises(BridgeError, match="the verifiers v1 episode failed"):
    harness(AgentTask(f"http://127.0.0.1:{free_port()}/v1", "key", "m", Problem("ab", "")))


def test_a_v1_environment_plays_through_the_endpoint(harness, tmp_path):
  tok = load_tokenizer(build_tokenizer("qwen2.5", str(tmp_path / "q")), chat_template=True)
  name = "t_vf1_reverse_text"
  if name not in harness_lib.HARNESSES:
    register_harness(name)(harness)
  cfg = dataclasses.replace(tiny_model_config(), vocab_size=tok.vocab_size,
                            eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
  base = JaxEngine(cfg)
  base.load_weights(jax.tree.map(lambda x: 4.0 * x, transformer.init_params(cfg, seed=1)), 0)
  settings = EnvSettings(name=name, engine="endpoint", max_tokens=64, timeout_s=300.0,
                         harness_workers=2, tool_format="hermes", max_prompt_tokens=200)
  engine = driver_lib.EndpointEngine(base, settings, tok, prompt_bucket=32)
  sp = dataclasses.replace(SP, stop_ids=(tok.eos_id,), pad_id=tok.pad_id, max_new_tokens=8)
  problems = [Problem("abc", ""), Problem("hello", "")]
  try:
    out = engine.episodes(problems, jax.random.PRNGKey(0), sp, 2)
  finally:
    engine.close()  # it stops the bridge too (the harness's close)
    harness_lib.close_harness_pool()
  assert out.counts["env/errors"] == 0 and out.counts["env/timeouts"] == 0, out.failures[:1]
  hf = AutoTokenizer.from_pretrained(tok.path)
  assert len(out.episodes) == 4
  for k, (ep, calls) in enumerate(zip(out.episodes, out.calls)):
    prompt = problems[k // 2].prompt
    (call,) = calls  # reverse_text is single-turn
    want = hf.apply_chat_template([{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": prompt}], tokenize=False,
                                  add_generation_prompt=True)
    assert call.prompt_ids == hf.encode(want, add_special_tokens=False)
    reply = ep.infos[0]["last_reply"]
    assert reply == tok.decode(call.completion_ids)  # the text the library scored
    assert ep.reward == pytest.approx(lcs_reward(reply, prompt[::-1]))


def test_the_verifiers_preset_trains_a_v1_environment_by_grpo(tmp_path, monkeypatch):
  """``rljax train --config configs/tasks/verifiers.py``: every episode's reward is the v1
  taskset's rubric (the ``difflib`` ratio of the reply against the reversal, recomputed here from
  the recorded ids), and the step's update is computed from exactly those rewards."""
  served = []  # (problems, result) of every batch the endpoint engine played
  episodes = driver_lib.EndpointEngine.episodes

  def recorded(self, problems, *args, **kwargs):
    out = episodes(self, problems, *args, **kwargs)
    served.append((list(problems), out, self.tokenizer))
    return out

  monkeypatch.setattr(driver_lib.EndpointEngine, "episodes", recorded)
  monkeypatch.chdir(tiny.ROOT)  # the preset names its tokenizer and rows from the repository
  run_dir = str(tmp_path / "run")
  overrides = {
      "model.hidden_size": "32", "model.intermediate_size": "64", "model.num_layers": "1",
      "model.num_heads": "2", "model.num_kv_heads": "1", "rollout.prompts_per_step": "2",
      "rollout.group_size": "2", "data.num_eval": "1", "train.steps": "1",
      "train.eval_every": "0", "train.progress": "false", "train.export_hf": "false",
      "train.run_dir": run_dir, "env.harness_workers": "4"}
  try:
    cli.main(["train", "--config", os.path.join(tiny.ROOT, "configs", "tasks", "verifiers.py")]
             + [f"--config.{k}={v}" for k, v in overrides.items()])
  finally:
    harness_lib.close_harness_pool()
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    (step,) = [m for m in map(json.loads, f) if "loss" in m]
  # Eval before, the training step (2 prompts x 2 samples), eval after (greedy, 1 prompt).
  assert [len(out.episodes) for _, out, _ in served] == [1, 4, 1]
  problems, out, tok = served[1]
  assert out.counts["env/errors"] == 0 and out.counts["env/timeouts"] == 0, out.failures[:1]
  rewards = []
  for ep, (call,) in zip(out.episodes, out.calls):
    reply = tok.decode(call.completion_ids)
    assert ep.infos[0]["last_reply"] == reply  # the text the library scored: the recorded ids
    answer = problems[ep.problem].prompt[::-1]
    assert ep.reward == pytest.approx(difflib.SequenceMatcher(None, reply.strip(), answer).ratio())
    rewards.append(ep.reward)
  # The rubric's rewards are what the update saw, and they differ within a group: a gradient.
  assert step["reward_mean"] == pytest.approx(np.mean(rewards), abs=1e-6)
  assert step["reward_std"] == pytest.approx(np.std(rewards), abs=1e-6)
  assert max(rewards) > 0 and step["grad_norm"] > 0
  assert step["logp_gap_max"] < 1e-3


def test_a_missing_verifiers_environment_is_one_line_at_start_up(tmp_path):
  play = verifiers_v1_harness(taskset="reverse_text", python=str(tmp_path / "bin" / "python"),
                              task_data=_task_data)
  with pytest.raises(StartupError, match="does not exist: scripts/bootstrap.sh makes "
                                         r"\.venv-verifiers"):
    play.prepare()

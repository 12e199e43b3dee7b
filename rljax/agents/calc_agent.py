"""``calc_agent``: a calculator agent written as ordinary OpenAI-client code, the endpoint's demo
(``configs/tasks/agent_calc.py``, docs/agents.md).

The agent loop a user would write against any completions server: send the transcript, stop at
the end of a calculator call (``stop=[">"]``), run the calculator, append the call's close and the
result to the transcript, send it again; an answer without a call ends the episode, scored by the
task's verifier (``exact_match``: the number after ``#``). On ``embedded:tool_calc`` this is the
``tool_calc`` environment's protocol (``'123*45='`` -> ``'<calc 123*45>5535 #5535'``), so the
``tool_calc`` SFT cold start plays it, and the in-process environment is its baseline. Every call
extends the previous one's prompt and answer (the stop string is appended back), so an episode is
one stitched trajectory.
"""
from __future__ import annotations

from rljax.agents.harness import AgentTask, register_harness
from rljax.envs import tools

MAX_CALLS = 3
MAX_TOKENS = 32


@register_harness("calc_agent")
def calc_agent(task: AgentTask):
  import openai  # the optional [agents] extra: harness processes only
  client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
  text = task.problem.prompt
  answer = ""
  for _ in range(MAX_CALLS):
    out = client.completions.create(model=task.model, prompt=text, max_tokens=MAX_TOKENS,
                                    stop=[">"])
    piece, finish = out.choices[0].text, out.choices[0].finish_reason
    opened = piece.rfind("<")
    # A call: the answer stopped at '>' right after '<name ...' (an EOS answer has no open '<').
    calls = (tools.parse_tool_calls(piece[opened:] + ">", "compact")
             if finish == "stop" and opened >= 0 and ">" not in piece[opened:] else [])
    if not calls:
      answer = piece
      break
    result, ok = tools.run_tool(calls[-1])
    text += piece + ">" + tools.result_text(result, ok, "compact")
  return task.score("exact_match", answer)

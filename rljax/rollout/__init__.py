"""The rollout: a jitted KV-cache sampler with group sampling, behind the engine seam
(``rljax.rollout.engines``; docs/rollout.md)."""
from rljax.rollout.text import completion_ids, generate_text, left_pad, text_prompts
from rljax.rollout.sampler import (SAMPLER_DTYPES, Rollout, SamplingParams, make_sampler,
                                   pick_tokens, process_logits, sample, slot_budget)

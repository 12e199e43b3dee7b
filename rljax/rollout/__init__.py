"""The rollout engine: a jitted KV-cache sampler with group sampling (see docs/rollout.md)."""
from rljax.rollout.engine import completion_ids, generate_text, left_pad
from rljax.rollout.sampler import (SAMPLER_DTYPES, Rollout, SamplingParams, make_sampler,
                                   pick_tokens, process_logits, sample, slot_budget)

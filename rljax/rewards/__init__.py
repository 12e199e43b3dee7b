"""Verifiable rewards: verifiers and their batched, time-limited scoring."""
from rljax.rewards.checkers import (REWARD_FNS, Scores, exact_match, final_answer, format_ok,
                                    get_reward_fn, math_verify_reward, register_reward,
                                    score_completions)

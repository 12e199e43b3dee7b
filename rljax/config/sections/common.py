"""What several sections declare with: the dtypes, a tuple of strings, the commands that read a
key (``Key.commands``)."""
from __future__ import annotations

from rljax.config.conditions import SFT_MODEL
from rljax.config.declare import COMMANDS, Check, reads

DTYPES = ("float32", "bfloat16", "float16")
STRING_TUPLE = Check(lambda v: isinstance(v, (tuple, list)) and all(isinstance(t, str) for t in v),
                     "a tuple of strings", tuple)

ALL_COMMANDS = reads(*COMMANDS)  # every command that builds a model reads it
# The RL run's, and the SFT cold start's (`rljax rm` trains it first for a reward model on it).
RL_SFT = reads("train", "eval", "plan", "sft", rm=SFT_MODEL)
RL_RM = reads("train", "eval", "plan", "rm")  # the RL run's, and reward-model training's

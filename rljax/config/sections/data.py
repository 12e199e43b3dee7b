"""The ``data.*`` keys: where prompts come from, how they are tokenised and checked.

Declared in the format ``rljax/config/table.py`` describes; the table concatenates the sections
in the order of docs/config.md."""
from __future__ import annotations

from rljax.config.declare import (BOOL, MEASURE, NONEMPTY, SEED, SIZE, STRING, Key, choice, integer,
                                  registered_spec)
from rljax.config.conditions import DATA_SOURCE_READS, EMBEDDED_SOURCE
from rljax.config.sections.common import ALL_COMMANDS, RL_SFT

# data.tokenizer's built-in vocabularies (rljax.data.tokenizer): characters; 'char_vl' adds image
# placeholder tokens.
CHAR_TOKENIZERS = ("char", "char_vl")

KEYS = (
    # --- data ----------------------------------------------------------------------------------
    Key("data.source", "embedded:arithmetic",
        registered_spec("data_source", "jsonl:data/train.jsonl"),
        "where prompts come from: a registered data source and its argument (docs/algorithms.md, "
        "'Data sources'): embedded:TASK | reasoning_gym:NAME[,NAME...] (extra [reasoning_gym]) | "
        "jsonl:PATH | hf:PATH "
        "(local datasets files) | code:PATH (unit-tested programming problems) | any registered "
        "source", commands=RL_SFT),
    Key("data.difficulty", 1, integer(0, 1000), "embedded tasks: problem difficulty",
        read_if=EMBEDDED_SOURCE, commands=RL_SFT),
    Key("data.train_seed", 0, SEED, "generated tasks: seed of the training problems"),
    Key("data.eval_seed", 1, SEED, "generated tasks: seed of the held-out problems",
        effect=MEASURE),
    Key("data.reasoning_gym.weights", "", STRING,
        "reasoning_gym source: 'NAME=W,NAME=W' sampling weight of each task; '' = equal",
        read_if=DATA_SOURCE_READS, commands=RL_SFT),
    Key("data.reasoning_gym.config", "{}", STRING,
        "reasoning_gym source: JSON {task: {setting: value}} passed to the task's generator "
        "(reasoning_gym.create_dataset); seed 0 and the library's size unless given",
        read_if=DATA_SOURCE_READS, commands=RL_SFT),
    Key("data.reasoning_gym.template", "{question}", NONEMPTY,
        "reasoning_gym source: the prompt, a str.format template over the item's question and "
        "metadata fields, e.g. '{expression}='", read_if=DATA_SOURCE_READS, commands=RL_SFT),
    Key("data.num_eval", 256, SIZE, "held-out problems evaluated before/after training",
        effect=MEASURE),
    Key("data.tokenizer", "char", NONEMPTY,
        "'char', 'char_vl' (with image placeholders) or a local Hugging Face tokenizer directory",
        commands=ALL_COMMANDS),
    Key("data.chat_template", False, BOOL, "wrap prompts in the tokenizer's chat template",
        commands=ALL_COMMANDS),
    Key("data.prompt_bucket", 32, SIZE,
        "prompts are left-padded to a multiple of this (fewer compilations)", commands=RL_SFT),
    Key("data.max_prompt_tokens", 0, integer(0, 2**31 - 1),
        "longest prompt in tokens; 0 = the model's context less rollout.max_new_tokens",
        commands=RL_SFT),
    Key("data.overlong_prompts", "error", choice("error", "drop"),
        "a longer prompt: 'error' (names it) | 'drop' (counted)", commands=RL_SFT),
    Key("data.invalid_rows", "error", choice("error", "drop"),
        "a row with an empty prompt/answer, a NUL byte or a prompt given two answers: 'error' "
        "(names file:line) | 'drop' (counted)", commands=ALL_COMMANDS),
)

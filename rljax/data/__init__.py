"""Embedded verifiable tasks, tokenizers and dataset loaders."""
from rljax.data.datasets import (PromptSource, load_problems, make_prompt_source, parse_source,
                                 read_jsonl)
from rljax.data.tasks import (MARKER, TASKS, Problem, Task, is_eval_prompt, make_task,
                              marked_answer)
from rljax.data.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer

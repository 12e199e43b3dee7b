"""Data sources (``data.source``, registered: ``rljax.data.sources``), embedded tasks, tokenizers
and dataset loaders."""
from rljax.data.datasets import PromptSource, load_problems, make_prompt_source, read_jsonl
from rljax.data.sources import (DATA_SOURCES, Rows, data_settings, parse_data_source,
                                register_data_source)
from rljax.data.tasks import (MARKER, TASKS, Problem, Task, is_eval_prompt, make_task,
                              marked_answer, register_task)
from rljax.data.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer

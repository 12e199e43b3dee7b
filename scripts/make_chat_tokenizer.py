"""Writes ``configs/tokenizers/chatml_chars``: a character-level Hugging Face tokenizer with a
ChatML chat template, for tiny policies that talk through ``/v1/chat/completions`` with no
download (``configs/tasks/verifiers.py``: a verifiers v1 environment sends chat messages).

One id per printable ASCII character and newline (a BPE with no merges, so every character is
its own token and ``decode(encode(text)) == text``), ``<unk>`` for anything else, and ChatML's
``<|im_start|>``, ``<|im_end|>`` (EOS: it ends an assistant message) and ``<|endoftext|>`` (pad).
The template renders system, user and assistant messages (no tools)::

  .venv/bin/python scripts/make_chat_tokenizer.py   # rewrites the directory
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "configs", "tokenizers", "chatml_chars")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def build(path: str = OUT) -> str:
  from tokenizers import Tokenizer, decoders, models
  from transformers import PreTrainedTokenizerFast
  vocab = {piece: i for i, piece in enumerate(SPECIALS + tuple(CHARS))}
  chars = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
  chars.decoder = decoders.Fuse()
  chars.add_special_tokens(list(SPECIALS))
  PreTrainedTokenizerFast(tokenizer_object=chars, eos_token="<|im_end|>",
                          pad_token="<|endoftext|>", unk_token="<unk>",
                          chat_template=TEMPLATE).save_pretrained(path)
  return path


if __name__ == "__main__":
  print(build())

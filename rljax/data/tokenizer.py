"""Tokenizers: one interface for the built-in character vocabulary and Hugging Face tokenizers.

The RL loop only ever talks to :class:`Tokenizer`. Two implementations:

- :class:`CharTokenizer`: a fixed, tiny vocabulary (one id per character) for the embedded tasks.
  Lengths in characters are lengths in tokens, which keeps toy experiments easy to reason about.
- :class:`HFTokenizer`: wraps ``transformers.AutoTokenizer`` loaded from a *local* directory,
  with the tokenizer's own chat template applied to prompts when asked.

``'char_vl'`` is the character vocabulary with Qwen2-VL's three image placeholder tokens after it
(``QWEN2_VL``; ids 57-59, so every ``'char'`` id keeps its meaning): a tiny vision-language policy
on the embedded visual task (``rljax.data.images``).

Conventions shared by both:

- ``encode(text)`` never adds special tokens; ``encode_prompt(prompt)`` is the one way a prompt
  becomes ids (chat template if enabled, then BOS if the tokenizer has one and the text does not
  already start with it). A prompt is text (one user message) or, with a chat template, a list of
  chat messages (``{"role": ..., "content": ...}``: a system message, then the user's).
- ``render_followup(messages)``: with a chat template, the text the template writes after an
  assistant message's final token (EOS) for the messages that answer it (tool results, a user
  reply) and the next assistant header: what a multi-turn rollout appends after a turn.
- ``decode(ids)`` does not stop at EOS (callers cut completions with their masks); it drops
  padding and, by default, the other special tokens so that verifiers see plain text.
"""
from __future__ import annotations

import abc
import dataclasses
import os
import re
from typing import Sequence

from rljax.config.table import CHAR_TOKENIZERS
from rljax.errors import TokenizerError

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"

# Order fixes the ids forever: changing it silently breaks every saved char-level checkpoint.
_CHAR_SPECIALS = (PAD, EOS, BOS)
_CHAR_SYMBOLS = (
    " \n"
    "0123456789"
    "+-*/=()"
    "#,.:;<>?!"
    "abcdefghijklmnopqrstuvwxyz"
)


@dataclasses.dataclass(frozen=True)
class Placeholders:
  """A family's image placeholder tokens, as its chat template writes them: an image is
  ``start`` + ``pad`` x (its image tokens) + ``end``."""
  start: str
  pad: str
  end: str


# Qwen2-VL, Qwen2.5-VL and Qwen3-VL write an image as these tokens (their chat templates).
QWEN2_VL = Placeholders("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


class Tokenizer(abc.ABC):
  """What the RL loop needs from a tokenizer."""

  eos_id: int
  pad_id: int
  bos_id: int | None
  vocab_size: int
  # The three tokens this vocabulary writes an image's placeholder with, whatever the family
  # (``'char_vl'``'s); None: the family's own (``rljax.data.images.image_format``).
  image_placeholders: Placeholders | None = None

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Token ids of ``text``, without any special token added."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of ``ids``. Padding is always dropped; EOS/BOS too unless ``skip_special_tokens=False``.

    Decoding does not stop at EOS: the caller decides where a completion ends (its mask).
    """

  @abc.abstractmethod
  def apply_chat_template(self, prompt) -> str:
    """The prompt (text, or chat messages with a chat template) as the model should see it
    (identity for text when no chat template is used)."""

  @property
  def chat_turns(self) -> bool:
    """Whether prompts are wrapped in a chat template, so that a multi-turn rollout writes its
    turns and observations as chat messages too (``render_followup``)."""
    return False

  def render_followup(self, messages: Sequence[dict]) -> str:
    """The chat template's text between an assistant message's final token and the policy's next
    turn: ``messages`` (tool results, a user reply) and the next assistant header."""
    raise TokenizerError(f"{type(self).__name__} has no chat template to render chat messages "
                         "with (data.chat_template=True with a Hugging Face tokenizer has one)")

  def render_chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
    """The text of a whole conversation up to the next assistant header, with the function
    ``tools`` offered (the chat template's own rendering; an agent endpoint's requests)."""
    raise TokenizerError(f"{type(self).__name__} has no chat template to render chat messages "
                         "with (data.chat_template=True with a Hugging Face tokenizer has one)")

  def fingerprint(self) -> str:
    """What fixes the ids of every text: two tokenizers with the same fingerprint encode any text
    alike (a model's ids mean the same under both). By default this very object only."""
    return f"{type(self).__qualname__}@{id(self)}"

  def encode_prompt(self, prompt) -> list[int]:
    """Ids of a prompt ready for generation: chat template, then BOS unless already present."""
    ids = self.encode(self.apply_chat_template(prompt))
    if self.bos_id is not None and (not ids or ids[0] != self.bos_id):
      ids = [self.bos_id] + ids
    return ids


class CharTokenizer(Tokenizer):
  """One token per character over a fixed built-in vocabulary (57 ids).

  Ids: 0 ``<pad>``, 1 ``<eos>``, 2 ``<bos>``, then space, newline, digits, ``+-*/=()``,
  ``#,.:;<>?!`` and lowercase letters. A character outside the vocabulary is an error (never a
  silent ``<unk>``), because a task that emits one is a bug. ``images=True`` (``'char_vl'``) adds
  ``QWEN2_VL``'s placeholder tokens as ids 57, 58, 59, each read whole from text.
  """

  def __init__(self, images: bool = False):
    extra = list(dataclasses.astuple(QWEN2_VL)) if images else []
    self._id_to_piece = list(_CHAR_SPECIALS) + list(_CHAR_SYMBOLS) + extra
    self._char_to_id = {ch: i + len(_CHAR_SPECIALS) for i, ch in enumerate(_CHAR_SYMBOLS)}
    self._special_ids = {piece: len(self._id_to_piece) - len(extra) + k
                         for k, piece in enumerate(extra)}
    self._split = re.compile("(" + "|".join(map(re.escape, extra)) + ")") if extra else None
    self.pad_id, self.eos_id, self.bos_id = 0, 1, 2
    self.vocab_size = len(self._id_to_piece)
    self.image_placeholders = QWEN2_VL if images else None

  @property
  def vocabulary(self) -> str:
    """All characters this tokenizer can encode, in id order."""
    return _CHAR_SYMBOLS

  def fingerprint(self) -> str:
    return "char:" + "".join(self._id_to_piece)

  def encode(self, text: str) -> list[int]:
    if self._split is not None:
      return [i for piece in self._split.split(text) if piece
              for i in ([self._special_ids[piece]] if piece in self._special_ids
                        else self._encode_chars(piece))]
    return self._encode_chars(text)

  def _encode_chars(self, text: str) -> list[int]:
    try:
      return [self._char_to_id[ch] for ch in text]
    except KeyError as e:
      raise TokenizerError(
          f"character {e.args[0]!r} in {text!r} is not in the char tokenizer's vocabulary "
          f"{_CHAR_SYMBOLS!r}") from None

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    pieces = []
    for i in ids:
      i = int(i)
      if i == self.pad_id or (skip_special_tokens and (
          i in (self.eos_id, self.bos_id) or i in self._special_ids.values())):
        continue
      # A model whose embedding table is larger than the vocabulary may sample an id with no
      # character: show it as U+FFFD so the completion is simply wrong, not a crashed run.
      pieces.append(self._id_to_piece[i] if 0 <= i < self.vocab_size else "\ufffd")
    return "".join(pieces)

  def apply_chat_template(self, prompt) -> str:
    return _text_prompt(prompt)


def _text_prompt(prompt) -> str:
  """A prompt without a chat template: text only (chat messages need a template)."""
  if not isinstance(prompt, str):
    raise TokenizerError(f"a prompt of chat messages needs a chat template (data.chat_template="
                         f"True with a Hugging Face tokenizer), got {type(prompt).__name__}")
  return prompt


# What the anchor conversation of ``render_followup`` holds: a user question and an assistant
# message with one tool call (the templates of Qwen3 and Llama 3.1 refuse a conversation with no
# user message, Llama 3.1 one with several calls in a message). The messages that answer it
# are rendered after it with placeholder contents, to find where they start.
_ANCHOR = ({"role": "user", "content": "?"},
           {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "tool", "arguments": {}}}]})
_PLACEHOLDER = "rljax-followup-{}-placeholder"


class HFTokenizer(Tokenizer):
  """A Hugging Face tokenizer loaded from a local directory.

  ``pad_id`` falls back to ``eos_id`` when the tokenizer defines no pad token (common for
  decoder-only models; padding is always masked explicitly, so the id itself never matters).
  """

  def __init__(self, path: str, chat_template: bool = False):
    self.path = path
    self._hf = _load_hf_tokenizer(path)
    if self._hf.eos_token_id is None:
      raise TokenizerError(f"data.tokenizer={path!r} defines no eos_token, so generation cannot "
                           "stop: set eos_token in its tokenizer_config.json (or use another "
                           "tokenizer)")
    if chat_template and not getattr(self._hf, "chat_template", None):
      raise TokenizerError(
          f"data.chat_template=True but the tokenizer at {path!r} has no chat template "
          "(tokenizer_config.json 'chat_template' or chat_template.jinja): add one, or set "
          "data.chat_template=False")
    self.use_chat_template = chat_template
    self.eos_id = int(self._hf.eos_token_id)
    pad = self._hf.pad_token_id
    self.pad_id = int(pad) if pad is not None else self.eos_id
    self.bos_id = int(self._hf.bos_token_id) if self._hf.bos_token_id is not None else None
    self.vocab_size = len(self._hf)

  def encode(self, text: str) -> list[int]:
    return list(self._hf.encode(text, add_special_tokens=False))

  def fingerprint(self) -> str:
    """The fast tokenizer's whole definition (vocabulary, merges, normaliser, pre-tokeniser,
    special tokens) as ``tokenizer.json`` holds it; a slow one's vocabulary and special ids."""
    backend = getattr(self._hf, "backend_tokenizer", None)
    if backend is not None:
      return backend.to_str()
    return repr((sorted(self._hf.get_vocab().items()), self.eos_id, self.pad_id, self.bos_id))

  def save_pretrained(self, path: str) -> None:
    """The tokenizer's files into ``path`` (beside an exported model)."""
    self._hf.save_pretrained(path)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    ids = [int(i) for i in ids]
    if self.pad_id != self.eos_id:
      ids = [i for i in ids if i != self.pad_id]
    # When pad and eos share an id, padding is indistinguishable from EOS: it is dropped with
    # the special tokens, or shown as EOS when they are kept.
    return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, prompt) -> str:
    if not self.use_chat_template:
      return _text_prompt(prompt)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return self._template(messages)

  @property
  def chat_turns(self) -> bool:
    return self.use_chat_template

  def render_chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
    if not self.use_chat_template:
      return super().render_chat(messages, tools)
    return self._template(list(messages), tools=list(tools) if tools else None)

  def _template(self, messages, tools=None) -> str:
    try:
      return self._hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                          add_generation_prompt=True)
    except Exception as e:  # jinja2's TemplateError, or the template's own raise_exception
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      roles = ", ".join(str(m.get("role")) if isinstance(m, dict) else "?" for m in messages)
      raise TokenizerError(f"the chat template of data.tokenizer={self.path!r} cannot render the "
                           f"messages ({roles}): {first}") from None

  def render_followup(self, messages: Sequence[dict]) -> str:
    """The followup's text: ``messages`` rendered after an anchor conversation (``_ANCHOR``) whose
    assistant message ends with EOS, from that EOS on. Where it starts is found with placeholder
    contents, so that a message's own content (which may hold any text) never moves it.

    For a Qwen-style template and one tool result ``42``: ``'\\n<|im_start|>user\\n<tool_response>
    \\n42\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n'`` (one string).
    """
    if not self.use_chat_template:
      return super().render_followup(messages)
    messages = [dict(m) for m in messages]
    marked = [dict(m, content=_PLACEHOLDER.format(k)) for k, m in enumerate(messages)]
    placed = self._template(list(_ANCHOR) + marked)
    eos = self._hf.decode([self.eos_id], skip_special_tokens=False)
    first = placed.find(_PLACEHOLDER.format(0))
    start = placed.rfind(eos, 0, first) if first >= 0 else -1
    if start < 0:
      raise TokenizerError(f"the chat template of data.tokenizer={self.path!r} writes no EOS "
                           f"({eos!r}) at the end of an assistant message with a tool call, so "
                           "the messages after a turn cannot be placed after its last token")
    start += len(eos)
    full = self._template(list(_ANCHOR) + messages)
    if full[:start] != placed[:start]:
      raise TokenizerError(f"the chat template of data.tokenizer={self.path!r} renders an "
                           "assistant message differently depending on the contents of the "
                           "messages after it")
    return full[start:]


def _load_hf_tokenizer(path: str):
  """``AutoTokenizer.from_pretrained`` on a local directory, with an error that names the path."""
  if not os.path.isdir(path):
    raise TokenizerError(
        f"data.tokenizer={path!r} is neither 'char' nor an existing local directory")
  try:
    from transformers import AutoTokenizer  # slow import: only when a HF tokenizer is used
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
  except Exception as e:  # transformers raises many types (OSError, ValueError, KeyError)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise TokenizerError(
        f"data.tokenizer={path!r} is not a Hugging Face tokenizer directory (expected "
        f"tokenizer.json or tokenizer_config.json with vocabulary files): {first}") from e


def load_tokenizer(name_or_path: str, chat_template: bool = False) -> Tokenizer:
  """``'char'`` (``'char_vl'``: with image placeholders) -> :class:`CharTokenizer`; a local
  directory -> :class:`HFTokenizer`."""
  if name_or_path in CHAR_TOKENIZERS:
    if chat_template:
      raise TokenizerError("data.chat_template=True needs a Hugging Face tokenizer, not "
                           f"{name_or_path!r}")
    return CharTokenizer(images=name_or_path == "char_vl")
  return HFTokenizer(name_or_path, chat_template=chat_template)

"""Tokenizers: char round trips and ids; a tiny local HF tokenizer through load_tokenizer."""
import pytest

from rljax.data import CharTokenizer, HFTokenizer, load_tokenizer, make_task, TASKS

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_char_round_trip_and_fixed_ids():
  tok = load_tokenizer("char", chat_template=False)
  assert isinstance(tok, CharTokenizer)
  text = "12+7*(3-4)=7*3=21,12+21=33 #33\nabc xyz:?!"
  ids = tok.encode(text)
  assert len(ids) == len(text)
  assert tok.decode(ids) == text
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
  assert tok.vocab_size == 57 and max(ids) < tok.vocab_size
  assert tok.encode("0") == [5]  # ids are part of saved checkpoints: never renumber


def test_char_decode_skips_pad_and_specials_but_does_not_stop_at_eos():
  tok = CharTokenizer()
  ids = [tok.pad_id, tok.pad_id] + tok.encode("1+1") + [tok.eos_id] + tok.encode("9")
  assert tok.decode(ids) == "1+19"
  assert tok.decode(ids, skip_special_tokens=False) == "1+1<eos>9"
  assert tok.decode([tok.vocab_size + 3] + tok.encode("7")) == "\ufffd7"
  assert tok.encode_prompt("1+1=") == [tok.bos_id] + tok.encode("1+1=")
  assert tok.apply_chat_template("1+1=") == "1+1="


def test_char_rejects_unknown_characters():
  with pytest.raises(ValueError, match="'Z'"):
    CharTokenizer().encode("Z")
  with pytest.raises(ValueError, match="chat_template"):
    load_tokenizer("char", chat_template=True)


def test_char_covers_every_embedded_task():
  tok = CharTokenizer()
  for name, cls in TASKS.items():
    for level in cls.levels:
      for p in make_task(name, level).eval_set(0, 8):
        assert tok.decode(tok.encode(p.prompt + p.solution)) == p.prompt + p.solution


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A byte-level BPE trained on a few strings, saved as a transformers tokenizer."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  specials = ["<pad>", "<eos>", "<bos>", "<|user|>", "<|assistant|>"]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["what is 2 + 3?", "the answer is 5", "12+7*3=33"] * 10, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                 bos_token="<bos>")
  fast.chat_template = CHAT_TEMPLATE
  path = tmp_path_factory.mktemp("hf_tokenizer")
  fast.save_pretrained(str(path))
  return str(path)


def test_hf_tokenizer_round_trip_and_special_ids(hf_dir):
  tok = load_tokenizer(hf_dir, chat_template=False)
  assert isinstance(tok, HFTokenizer)
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
  assert tok.vocab_size >= 256
  text = "what is 12 + 7?\nNew words: Zebra!"
  ids = tok.encode(text)
  assert tok.bos_id not in ids  # encode adds no special token
  assert tok.decode(ids) == text
  assert tok.decode([tok.pad_id] + ids + [tok.eos_id, tok.pad_id]) == text
  assert tok.apply_chat_template("hi") == "hi"


def test_hf_chat_template_applied_when_asked(hf_dir):
  tok = load_tokenizer(hf_dir, chat_template=True)
  assert tok.apply_chat_template("what is 2 + 3?") == "<|user|>what is 2 + 3?\n<|assistant|>"
  ids = tok.encode_prompt("what is 2 + 3?")
  assert ids[0] == tok.bos_id
  assert tok.decode(ids) == "what is 2 + 3?\n"  # role markers are special tokens


def test_chat_template_required_when_asked(hf_dir, tmp_path):
  import shutil
  bare = tmp_path / "no_template"
  shutil.copytree(hf_dir, bare)
  (bare / "chat_template.jinja").unlink()
  assert load_tokenizer(str(bare), chat_template=False).apply_chat_template("x") == "x"
  with pytest.raises(ValueError, match="has no chat template"):
    load_tokenizer(str(bare), chat_template=True)


def test_load_tokenizer_errors_name_the_path(tmp_path):
  with pytest.raises(ValueError, match="no/such/dir"):
    load_tokenizer("no/such/dir", chat_template=False)
  (tmp_path / "readme.txt").write_text("not a tokenizer")
  with pytest.raises(ValueError, match=str(tmp_path)):
    load_tokenizer(str(tmp_path), chat_template=False)

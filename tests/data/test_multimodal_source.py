"""Rows with images (JSONL paths or base64, a Hugging Face ``datasets`` image column): what they
decode to, and the prompt batch a vision-language policy takes, against Hugging Face's own
Qwen2-VL processor (patches, grid sizes and the placeholder-expanded input ids); each bad input's
one-line error."""
import base64
import dataclasses
import json

import numpy as np
import pytest

PIL = pytest.importorskip("PIL.Image")

from rljax.config.checks import check_config
from rljax.config.table import get_config
from rljax.data import datasets, load_problems, load_tokenizer
from rljax.data.images import (QWEN2_VL, encode_image_prompts, placeholder_count,
                               qwen2_vl_image_processor)
from rljax.errors import ConfigError, DataError, TokenizerError

# Sizes: two kept as drawn (multiples of 28), one the processor resizes (40 x 90).
SIZES = [(56, 84), (28, 56), (40, 90)]
# Images in the middle of text, two in one prompt, and a text-only row beside them.
ROWS = [("what is in <image> here?", [0], "3"), ("<image> and <image>: which is larger?", [1, 2],
        "left"), ("no image: 2 + 3 =", [], "5")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("images")
  rng = np.random.default_rng(0)
  paths = []
  for k, (h, w) in enumerate(SIZES):
    path = root / f"im{k}.png"
    PIL.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    paths.append(path)

  def write(name, encode):
    with open(root / name, "w") as f:
      for prompt, images, answer in ROWS:
        f.write(json.dumps({"prompt": prompt, "answer": answer,
                            "images": [encode(paths[i]) for i in images]}) + "\n")
    return str(root / name)

  b64 = lambda p: base64.b64encode(p.read_bytes()).decode()
  return {
      "root": root, "paths": paths,
      "paths.jsonl": write("paths.jsonl", lambda p: p.name),  # relative to the file's folder
      "base64.jsonl": write("base64.jsonl", b64),
      "url.jsonl": write("url.jsonl", lambda p: "data:image/png;base64," + b64(p)),
  }


@pytest.fixture(scope="module")
def processor():
  return qwen2_vl_image_processor(min_pixels=28 * 28, max_pixels=28 * 28 * 16)


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
  """A byte-level BPE with Qwen2-VL's image placeholder tokens, saved as a transformers
  tokenizer: (its directory, the transformers tokenizer)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  specials = ["<pad>", "<eos>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
              "<|video_pad|>"]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator([p for p, _, _ in ROWS] * 10, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
  path = tmp_path_factory.mktemp("vl_tokenizer")
  fast.save_pretrained(str(path))
  return str(path), fast


def test_paths_base64_and_data_urls_read_the_same_images(files, processor, hf_tokenizer):
  tok = load_tokenizer(hf_tokenizer[0])
  loaded = {n: load_problems(f"jsonl:{files[n]}", split="all")
            for n in ("paths.jsonl", "base64.jsonl", "url.jsonl")}
  first = loaded["paths.jsonl"]
  assert [len(p.images) for p in first] == [1, 2, 0]
  assert first[0].images[0].pixels.shape == SIZES[0] + (3,)
  assert np.array_equal(first[0].images[0].pixels, np.asarray(PIL.open(files["paths"][0])))
  batches = [encode_image_prompts(tok, rows, processor) for rows in loaded.values()]
  for rows, batch in zip(loaded.values(), batches):
    assert [p.images for p in rows] == [p.images for p in first]
    assert np.array_equal(batch.pixel_values, batches[0].pixel_values)
    assert batch.ids == batches[0].ids


def _hf_processor(processor, tokenizer):
  """Hugging Face's Qwen2-VL processor (images and text; its video processor needs torchvision,
  which images do not use)."""
  from transformers import Qwen2VLProcessor

  class ImagesOnly(Qwen2VLProcessor):
    def check_argument_for_proper_class(self, name, argument):
      if name != "video_processor":
        return super().check_argument_for_proper_class(name, argument)

  return ImagesOnly(image_processor=processor, tokenizer=tokenizer)


# Qwen2-VL / Qwen2.5-VL's processor settings (the fixture), and Qwen3-VL's (16-pixel patches,
# mean and std 0.5): the same placeholder tokens, other grids.
QWEN3_VL = dict(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3, min_pixels=32 * 32,
                max_pixels=32 * 32 * 16)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_patches_grids_and_placeholders_equal_hf_processors(files, processor, hf_tokenizer,
                                                            family):
  if family == "qwen3_vl":
    processor = qwen2_vl_image_processor(**QWEN3_VL)
  path, fast = hf_tokenizer
  problems = load_problems(f"jsonl:{files['paths.jsonl']}", split="all")
  ours = encode_image_prompts(load_tokenizer(path), problems, processor)
  hf = _hf_processor(processor, fast)
  marked = "".join((QWEN2_VL.start, QWEN2_VL.pad, QWEN2_VL.end))
  want = hf(text=[p.replace("<image>", marked) for p, _, _ in ROWS],
            images=[PIL.open(p).convert("RGB") for p in files["paths"]], return_tensors="np")
  np.testing.assert_array_equal(ours.pixel_values, want["pixel_values"])
  np.testing.assert_array_equal(ours.image_grid_thw, want["image_grid_thw"])
  assert ours.ids == [list(ids[m.astype(bool)]) for ids, m in
                      zip(want["input_ids"], want["attention_mask"])]
  assert ours.image_prompt.tolist() == [0, 1, 1]
  if family == "qwen2_5_vl":  # (56, 84) and (28, 56) as drawn, (40, 90) resized
    assert ours.image_grid_thw.tolist()[:2] == [[1, 4, 6], [1, 2, 4]]
  pad = fast.convert_tokens_to_ids(QWEN2_VL.pad)
  runs = [sum(1 for i in ids if i == pad) for ids in ours.ids]
  counts = [int(np.prod(g)) // 4 for g in ours.image_grid_thw]
  assert runs == [counts[0], counts[1] + counts[2], 0]
  assert [placeholder_count(g, 2) for g in ours.image_grid_thw] == counts
  size = processor.patch_size
  assert ours.pixel_values.shape == (sum(int(np.prod(g)) for g in ours.image_grid_thw),
                                     3 * 2 * size * size)


def test_hf_dataset_image_column_reads_like_jsonl(files, tmp_path):
  import datasets as hf_datasets
  pictures = [PIL.open(p).convert("RGB") for p in files["paths"]]
  features = hf_datasets.Features({"images": hf_datasets.List(hf_datasets.Image()),
                                   "problem": hf_datasets.Value("string"),
                                   "answer": hf_datasets.Value("string")})
  table = hf_datasets.Dataset.from_dict(
      {"images": [[pictures[i] for i in images] for _, images, _ in ROWS],
       "problem": [p for p, _, _ in ROWS], "answer": [a for _, _, a in ROWS]}, features=features)
  table.to_parquet(str(tmp_path / "geo.parquet"))
  rows = load_problems(f"hf:{tmp_path / 'geo.parquet'}", split="all")
  jsonl = load_problems(f"jsonl:{files['paths.jsonl']}", split="all")
  assert [(p.prompt, p.answer, p.images) for p in rows] == \
      [(p.prompt, p.answer, p.images) for p in jsonl]


def _write(tmp_path, rows, name="bad.jsonl"):
  path = tmp_path / name
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _one_line_error(kind, fn, match):
  with pytest.raises(kind, match=match) as err:
    fn()
  assert "\n" not in str(err.value)


def test_missing_and_corrupt_image_files_are_one_line_errors(files, tmp_path):
  (tmp_path / "broken.png").write_bytes(files["paths"][0].read_bytes()[:60])
  (tmp_path / "text.png").write_bytes(b"not an image at all")
  for image, match in (("gone.png", r"bad.jsonl:1 image 0: image file .*gone.png' does not exist"),
                       ("broken.png", r"bad.jsonl:1 image 0: image file .*broken.png' is not a "
                                      "readable image"),
                       ("text.png", "text.png' is not a readable image"),
                       ("A" * 80, "a base64 image is not a readable image")):
    path = _write(tmp_path, [{"prompt": "<image>?", "answer": "1", "images": [image]}])
    _one_line_error(DataError, lambda: load_problems(f"jsonl:{path}", split="all"), match)


@pytest.mark.parametrize("prompt,count,match", [
    ("<image> once", 2, "the prompt has 1 <image> marker and 2 images"),
    ("<image> and <image>", 1, "the prompt has 2 <image> markers and 1 image:"),
    ("no marker", 1, "the prompt has 0 <image> markers and 1 image:"),
])
def test_images_the_markers_do_not_place_are_refused_or_dropped_and_counted(
    files, tmp_path, prompt, count, match):
  good = {"prompt": "<image>", "answer": "1", "images": [str(files["paths"][0])]}
  bad = {"prompt": prompt, "answer": "2", "images": [str(files["paths"][1])] * count}
  path = _write(tmp_path, [good, bad])
  _one_line_error(DataError, lambda: load_problems(f"jsonl:{path}", split="all"),
                  "bad.jsonl:2: " + match)
  rows = datasets.jsonl_source(path, datasets.data_settings(invalid_rows="drop"))
  assert (len(rows.rows), rows.invalid_rows) == (1, 1)


def test_a_prompt_that_writes_a_placeholder_itself_is_refused(files, processor, hf_tokenizer):
  problem = load_problems(f"jsonl:{files['paths.jsonl']}", split="all")[0]
  problem = dataclasses.replace(problem, prompt="<|image_pad|> and <image>")
  _one_line_error(DataError, lambda: encode_image_prompts(load_tokenizer(hf_tokenizer[0]),
                                                          [problem], processor),
                  "paths.jsonl:1: the prompt writes an image placeholder token itself")


def test_images_in_a_text_only_models_prompts_are_refused(files, processor):
  problems = load_problems(f"jsonl:{files['paths.jsonl']}", split="all")
  # A text-only model's tokenizer has no placeholder token to place an image with.
  _one_line_error(TokenizerError, lambda: encode_image_prompts(load_tokenizer("char"), problems,
                                                               processor),
                  "no '<\\|image_pad\\|>' token")
  # A run whose policy takes text only: refused when its source is read ...
  config = get_config()
  config.data.source = f"jsonl:{files['paths.jsonl']}"
  _one_line_error(DataError, lambda: datasets.make_prompt_source(config.data),
                  "its prompts show images, and this run's policy and rollouts take text only")
  assert datasets.make_prompt_source(config.data, takes_images=True).shows_images
  # ... or, for a task of images, by the config check before anything is built (with a text
  # task, the same config passes every check).
  config = get_config()
  config.data.source, config.data.tokenizer = "embedded:visual_arithmetic", "char_vl"
  _one_line_error(ConfigError, lambda: check_config(config), "poses its problems as images")
  config.data.source = "embedded:arithmetic"
  check_config(config)


def test_the_embedded_visual_task_encodes_with_the_char_vl_vocabulary(processor):
  from rljax.data import make_task
  problems = make_task("visual_arithmetic", 1).eval_set(seed=0, n=2)
  tok = load_tokenizer("char_vl")
  batch = encode_image_prompts(tok, problems, processor)
  assert batch.image_grid_thw.tolist() == [[1, 2, 6]] * 2  # 28 x 84 pixels, kept as drawn
  # <bos>, <|vision_start|> (57), 1*2*6/4 = 3 x <|image_pad|> (58), <|vision_end|> (59), '='.
  assert batch.ids == [[2, 57, 58, 58, 58, 59, tok.encode("=")[0]]] * 2
  assert tok.decode(batch.ids[0]) == "="
  assert load_tokenizer("char").encode("12+3") == tok.encode("12+3")  # 'char' ids unchanged


def test_a_resumed_run_sees_a_changed_image_file(files, tmp_path):
  from rljax.data.sources import fingerprint
  (tmp_path / "a.png").write_bytes(files["paths"][0].read_bytes())
  path = _write(tmp_path, [{"prompt": "<image>", "answer": "1", "images": ["a.png"]}], "x.jsonl")
  before = fingerprint(f"jsonl:{path}")
  (tmp_path / "a.png").write_bytes(files["paths"][1].read_bytes())
  assert fingerprint(f"jsonl:{path}") != before
  assert datasets._jsonl_files(files["base64.jsonl"]) == [files["base64.jsonl"]]


def _bpe(specials, **tokens):
  """A byte-level BPE over the rows' text with ``specials`` (BOS added as Gemma's is),
  saved as a transformers tokenizer: (its directory, the transformers tokenizer)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  from transformers import PreTrainedTokenizerFast
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator([p for p, _, _ in ROWS] * 10 + ["\n\n"], trainer)
  tok.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                     special_tokens=[("<bos>", 2)])
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                 bos_token="<bos>", extra_special_tokens=tokens)


# Each family's run format, built by rljax (image_format of the tiny tower, Gemma 3 with 4 soft
# tokens an image) and the Hugging Face processor built here from the settings its released
# preprocessor_config.json writes, with that processor's own placeholder expansion.
FAMILIES = {
    "gemma3": (["<pad>", "<eos>", "<bos>", "<start_of_image>", "<image_soft_token>",
                "<end_of_image>"],
               dict(boi_token="<start_of_image>", image_token="<image_soft_token>",
                    eoi_token="<end_of_image>")),
    "qwen3_vl": (["<pad>", "<eos>", "<bos>", "<|vision_start|>", "<|image_pad|>",
                  "<|vision_end|>", "<|video_pad|>"], {}),
}


def _family_format(family, tokenizer, path=None):
  from types import SimpleNamespace

  from rljax.data.images import image_format
  from rljax.vision import gemma3_vl, qwen3_vl
  vision = (dict(gemma3_vl.TINY_VISION, mm_tokens_per_image=4) if family == "gemma3"
            else dict(qwen3_vl.TINY_VISION))
  return image_format(SimpleNamespace(model_type=family, vision=vision), tokenizer, path)


def _hf_family_processor(family, fast):
  from transformers import (Gemma3ImageProcessorPil, Gemma3Processor, Qwen2VLImageProcessorPil,
                            Qwen3VLProcessor)
  if family == "gemma3":  # 896 in the release; the tiny tower's 28 here
    images = Gemma3ImageProcessorPil(size={"height": 28, "width": 28}, image_mean=[0.5] * 3,
                                     image_std=[0.5] * 3, resample=2, do_pan_and_scan=False)
    return Gemma3Processor(image_processor=images, tokenizer=fast, image_seq_length=4), \
        "<start_of_image>"

  class ImagesOnly(Qwen3VLProcessor):  # its video processor needs torchvision
    def check_argument_for_proper_class(self, name, argument):
      if name != "video_processor":
        return super().check_argument_for_proper_class(name, argument)

  images = Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2,
                                    image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                    min_pixels=32 * 32, max_pixels=16777216)
  return ImagesOnly(image_processor=images, tokenizer=fast), \
      "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.mark.parametrize("family", ["gemma3", "qwen3_vl"])
def test_family_run_format_equals_hf_processor(files, tmp_path, family):
  """Gemma 3: each image a 28 x 28 resize and 4 soft tokens between its boi/eoi tokens and blank
  lines; Qwen3-VL: 16-pixel patches merged 2 x 2 (grid by the image's size); both equal to
  Gemma3Processor's / Qwen3VLProcessor's ids and pixels."""
  specials, tokens = FAMILIES[family]
  fast = _bpe(specials, **tokens)
  fast.save_pretrained(str(tmp_path))
  tok = load_tokenizer(str(tmp_path))
  fmt = _family_format(family, tok)
  problems = load_problems(f"jsonl:{files['paths.jsonl']}", split="all")
  ours = encode_image_prompts(tok, problems, fmt)
  hf, marked = _hf_family_processor(family, fast)
  # Gemma3Processor takes one list of images per prompt; Qwen3VLProcessor a flat list.
  pil = [PIL.open(p).convert("RGB") for p in files["paths"]]
  per_prompt = [[pil[i] for i in images] for _, images, _ in ROWS]
  want = hf(text=[p.replace("<image>", marked) for p, _, _ in ROWS],
            images=per_prompt if family == "gemma3" else pil, return_tensors="np")
  np.testing.assert_array_equal(ours.pixel_values, want["pixel_values"])
  assert ours.ids == [list(ids[m.astype(bool)]) for ids, m in
                      zip(want["input_ids"], want["attention_mask"])]
  assert ours.image_prompt.tolist() == [0, 1, 1]
  pad = fast.convert_tokens_to_ids(specials[4])
  runs = [sum(1 for i in ids if i == pad) for ids in ours.ids]
  if family == "gemma3":
    assert ours.image_grid_thw is None and ours.pixel_values.shape == (3, 3, 28, 28)
    assert runs == [4, 8, 0]
    newline = fast.encode("\n\n", add_special_tokens=False)
    start = ours.ids[0].index(fast.convert_tokens_to_ids("<start_of_image>"))
    assert ours.ids[0][start - len(newline):start] == newline
  else:
    np.testing.assert_array_equal(ours.image_grid_thw, want["image_grid_thw"])
    # (56, 84) -> 64 x 96 (multiples of 32): grid 1 x 4 x 6, 6 tokens; (28, 56) -> 32 x 64
    assert ours.image_grid_thw.tolist()[:2] == [[1, 4, 6], [1, 2, 4]]
    counts = [int(np.prod(g)) // 4 for g in ours.image_grid_thw]
    assert runs == [counts[0], counts[1] + counts[2], 0]
    assert ours.pixel_values.shape[1] == 3 * 2 * 16 * 16


def test_gemma3_pan_and_scan_processor_is_refused(tmp_path):
  """A Gemma 3 model directory whose processor crops (pan-and-scan) would give an image more
  soft tokens than one marker places: one line naming the setting."""
  from rljax.data.images import gemma3_image_processor
  processor = gemma3_image_processor(28)
  processor.do_pan_and_scan = True
  processor.save_pretrained(str(tmp_path))
  _one_line_error(DataError, lambda: _family_format("gemma3", None, str(tmp_path)),
                  "do_pan_and_scan=true")


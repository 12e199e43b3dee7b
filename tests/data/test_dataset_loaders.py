"""Dataset loaders (JSONL, HF local files) and the resumable PromptSource."""
import json
import sys

import pytest

from rljax.data import (PromptSource, is_eval_prompt, load_problems, make_prompt_source,
                        parse_data_source, read_jsonl)


def write_jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


@pytest.fixture
def qa_file(tmp_path):
  records = [{"prompt": f"what is {i}+{i}?", "answer": 2 * i} for i in range(200)]
  return write_jsonl(tmp_path / "qa.jsonl", records)


def test_parse_data_source_errors_list_the_sources():
  assert parse_data_source("jsonl:a/b.jsonl") == ("jsonl", "a/b.jsonl")
  with pytest.raises(ValueError, match="embedded"):
    parse_data_source("csv:x.csv")


def test_jsonl_loader_reads_fields_and_splits_by_prompt_hash(qa_file):
  rows = load_problems("jsonl:" + qa_file, split="all")
  assert len(rows) == 200
  assert (rows[3].prompt, rows[3].answer, rows[3].meta["line"]) == ("what is 3+3?", "6", 4)
  train = load_problems("jsonl:" + qa_file, split="train")
  evals = load_problems("jsonl:" + qa_file, split="eval")
  assert len(train) + len(evals) == 200 and evals
  assert all(is_eval_prompt(p.prompt) for p in evals)
  assert load_problems("jsonl:" + qa_file, split="all", n=5) == rows[:5]


def test_jsonl_missing_field_names_the_line_and_field(tmp_path):
  path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
  with pytest.raises(ValueError, match=r"bad.jsonl:2: missing field 'answer'"):
    read_jsonl(path)
  (tmp_path / "broken.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{oops\n')
  with pytest.raises(ValueError, match=r"broken.jsonl:2: not valid JSON"):
    read_jsonl(str(tmp_path / "broken.jsonl"))


def test_hf_source_without_datasets_says_how_to_install(qa_file, monkeypatch):
  monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
  with pytest.raises(ImportError, match="pip install datasets"):
    load_problems("hf:" + qa_file, split="all")


def test_hf_source_reads_local_files_through_datasets(qa_file, tmp_path):
  rows = load_problems("hf:" + str(tmp_path), split="all")  # a directory of files
  assert len(rows) == 200 and rows[0].answer == "0"
  parquet = tmp_path / "pq"
  parquet.mkdir()
  import datasets
  datasets.Dataset.from_list([{"question": r.prompt, "answer": r.answer} for r in rows[:5]]
                             ).to_parquet(str(parquet / "part.parquet"))
  with pytest.raises(ValueError, match="no column 'prompt'; columns: \\['answer', 'question'\\]"):
    load_problems("hf:" + str(parquet), split="all")


def test_embedded_load_problems_matches_the_task():
  train = load_problems("embedded:arithmetic", split="train", seed=0, n=5, difficulty=2)
  evals = load_problems("embedded:arithmetic", split="eval", seed=1, n=5, difficulty=2)
  assert len(train) == len(evals) == 5
  assert not {p.prompt for p in train} & {p.prompt for p in evals}
  with pytest.raises(ValueError, match="need n"):
    load_problems("embedded:arithmetic", split="train")


@pytest.mark.parametrize("source", ["embedded:countdown", "jsonl"])
def test_prompt_source_resumes_at_the_same_position(source, qa_file):
  source = "jsonl:" + qa_file if source == "jsonl" else source
  run = PromptSource(source, difficulty=2, train_seed=5, eval_seed=1)
  first = [run.next_batch(8) for _ in range(40)]  # 320 rows: crosses a file epoch
  state = run.state_dict()
  expected = run.next_batch(8)
  resumed = PromptSource(source, difficulty=2, train_seed=5, eval_seed=1)
  resumed.load_state_dict(json.loads(json.dumps(state)))
  assert resumed.next_batch(8) == expected
  fresh = PromptSource(source, difficulty=2, train_seed=5, eval_seed=1)
  assert [fresh.next_batch(8) for _ in range(40)] == first
  other_seed = PromptSource(source, difficulty=2, train_seed=6, eval_seed=1)
  with pytest.raises(ValueError, match="train_seed"):
    other_seed.load_state_dict(state)


def test_prompt_source_file_epochs_cover_every_train_row_once(qa_file):
  run = PromptSource("jsonl:" + qa_file, train_seed=0)
  n_train = len(load_problems("jsonl:" + qa_file, split="train"))
  epoch = run.next_batch(n_train)
  assert sorted(p.prompt for p in epoch) == sorted(
      p.prompt for p in load_problems("jsonl:" + qa_file, split="train"))
  assert not any(is_eval_prompt(p.prompt) for p in epoch)
  assert run.next_batch(n_train) != epoch  # reshuffled per epoch


def test_prompt_source_eval_sets(qa_file, tmp_path):
  source = PromptSource("jsonl:" + qa_file, eval_seed=1)
  assert source.eval_set(3) == source.eval_set(3)
  assert all(is_eval_prompt(p.prompt) for p in source.eval_set(100))
  eval_file = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "Q", "answer": "A"}])
  split = PromptSource("jsonl:" + qa_file, eval_source="jsonl:" + eval_file)
  assert [p.prompt for p in split.eval_set(10)] == ["Q"]
  tiny = write_jsonl(tmp_path / "tiny.jsonl", [{"prompt": "what is 1+1?", "answer": "2"}])
  if not is_eval_prompt("what is 1+1?"):
    with pytest.raises(ValueError, match="has no eval rows.*needs more rows"):
      PromptSource("jsonl:" + tiny).eval_set(4)


def test_make_prompt_source_from_the_config():
  from configs.base import get_config
  data = get_config().data
  source = make_prompt_source(data)
  assert len(source.eval_set(data.num_eval)) == data.num_eval
  assert source.next_batch(2)[0].meta == {"task": "arithmetic", "difficulty": data.difficulty}
  sft_stream = make_prompt_source(data, stream_seed=1234)
  assert sft_stream.train_seed == 1234 and sft_stream.next_batch(4) != make_prompt_source(
      data).next_batch(4)
  assert sft_stream.eval_set(8) == source.eval_set(8)

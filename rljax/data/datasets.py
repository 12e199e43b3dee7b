"""Prompts from local dataset files, and the one ``PromptSource`` every data source is read through.

The data sources themselves (``data.source='NAME:ARGS'``) are registered
(``rljax.data.sources``); two read local files and are registered here:

- ``'jsonl:PATH'``: one JSON object per line with string fields ``prompt`` (or ``problem``) and
  ``answer`` (``solution`` optional, for SFT; ``images`` optional: a list of image paths, relative
  to the file's folder, or base64 strings, one ``<image>`` marker in the prompt per image,
  ``rljax.data.images``). An integer answer is read as its decimal text (``3`` ->
  ``'3'``); any other non-string answer (``3.0``, ``true``, ``[3]``, an object) is an error
  naming file and line, since its text would never match what a verifier extracts;
- ``'code:PATH'``: programming problems checked by unit tests, a JSONL file in the MBPP or
  HumanEval layout (``rljax.data.code_tasks``; ``reward.fn='code_tests'``);
- ``'hf:PATH'``: a local ``.jsonl``/``.json``/``.parquet`` file, or a directory of them, read
  with Hugging Face ``datasets`` (same fields; ``images`` may be the ``datasets`` image feature,
  as Geometry3K's ``images`` + ``problem`` + ``answer``). Nothing is downloaded.

Generated sources (a ``Task``) give an infinite train stream per ``data.train_seed`` and a
held-out set per ``data.eval_seed``. Finite sources (``Rows``) are split like the generated
tasks, by a hash of the prompt (``is_eval_prompt``), unless the source holds its rows out itself
or ``PromptSource`` is given a separate ``eval_source``.

Rows a run cannot learn from (an empty prompt or answer, a NUL byte, the same prompt and images
with two different answers, images that the prompt's ``<image>`` markers do not place one each) follow ``data.invalid_rows``: ``'error'`` names the first one (file:line and
the problem), ``'drop'`` leaves them all out, logs one line and counts them
(``PromptSource.invalid_rows``, the ``data/invalid_rows`` metric).
"""
from __future__ import annotations

import glob
import json
import logging
import numbers
import os
import random

from rljax.data.images import image_path, marker_problem, read_images, row_key
from rljax.data.prompt_policy import where
from rljax.data.sources import Rows, data_settings, open_data_source, register_data_source
from rljax.data.tasks import Problem, is_eval_prompt
from rljax.errors import DataError, DataFileNotFoundError, MissingPackageError

logger = logging.getLogger(__name__)

INVALID_ROWS = ("error", "drop")
SPLITS = ("train", "eval", "all")
_HF_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def read_jsonl(path: str) -> list[Problem]:
  """Problems of a JSONL file; a bad line raises an error naming the line and the field."""
  problems = []
  if not os.path.isfile(path):
    raise DataFileNotFoundError(f"data.source file {path!r} does not exist")
  with open(path, "rb") as f:
    for line_number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{path}:{line_number}: not UTF-8 text (byte {raw[e.start]:#04x} at "
                         f"column {e.start + 1})") from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{path}:{line_number}: not valid JSON ({e.msg})") from None
      problems.append(_problem_from_record(record, f"{path}:{line_number}",
                                           {"source": path, "line": line_number},
                                           os.path.dirname(path)))
  return problems


def read_hf(path: str) -> list[Problem]:
  """Problems of local dataset files read with Hugging Face ``datasets`` (never downloads)."""
  try:
    import datasets  # the optional [hf] extra: hf: data sources only
  except ImportError:
    raise MissingPackageError(
        f"data.source='hf:{path}' needs the Hugging Face datasets library: pip install datasets"
    ) from None
  files = _dataset_files(path)
  builder = _HF_BUILDERS[os.path.splitext(files[0])[1]]
  table = datasets.load_dataset(builder, data_files=files, split="train")
  missing = [f for f in ("prompt", "answer") if f not in table.column_names]
  if missing == ["prompt"] and "problem" in table.column_names:
    missing = []
  if missing:
    raise DataError(
        f"hf:{path} has no column {missing[0]!r}; columns: {sorted(table.column_names)}")
  base_dir = path if os.path.isdir(path) else os.path.dirname(path)
  return [_problem_from_record(row, f"hf:{path} row {i}", {"source": path, "row": i}, base_dir)
          for i, row in enumerate(table)]


def _dataset_files(path: str) -> list[str]:
  """The data files at ``path`` (one file or a directory), all of one supported format."""
  if os.path.isdir(path):
    files = sorted(f for ext in _HF_BUILDERS for f in glob.glob(os.path.join(path, "*" + ext)))
  elif os.path.isfile(path):
    files = [path]
  else:
    raise DataFileNotFoundError(f"data.source path {path!r} does not exist")
  if not files:
    raise DataError(f"no {sorted(_HF_BUILDERS)} files in directory {path!r}")
  builders = {_HF_BUILDERS.get(os.path.splitext(f)[1]) for f in files}
  if None in builders or len(builders) > 1:
    raise DataError(
        f"{path!r}: dataset files must all be one of {sorted(_HF_BUILDERS)}; got {files}")
  return files


def _problem_from_record(record, where: str, meta: dict, base_dir: str = "") -> Problem:
  """A Problem from a ``{'prompt' (or 'problem'), 'answer'[, 'solution', 'images']}`` mapping;
  ``where`` names it in errors, ``base_dir`` is where relative image paths start."""
  if not isinstance(record, dict):
    raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
  prompt_field = "problem" if record.get("prompt") is None and "problem" in record else "prompt"
  for field in (prompt_field, "answer"):
    if field not in record or record[field] is None:
      raise DataError(f"{where}: missing field {field!r} (fields: {sorted(record)})")
  if not isinstance(record[prompt_field], str):
    raise DataError(f"{where}: field {prompt_field!r} must be a string, got "
                    f"{record[prompt_field]!r}")
  return Problem(prompt=record[prompt_field], answer=_answer_text(record["answer"], where),
                 solution=str(record.get("solution") or ""), meta=meta,
                 images=read_images(record.get("images"), where, base_dir))


def _answer_text(answer, where: str) -> str:
  """Integers are common gold answers in JSON (GSM8K-style) and have one text; a float, a bool
  or a container does not (``3.0`` -> ``'3.0'`` never equals an extracted ``'3'``)."""
  if isinstance(answer, str):
    return answer
  if isinstance(answer, numbers.Integral) and not isinstance(answer, bool):
    return str(int(answer))
  raise DataError(f"{where}: field 'answer' must be a string (or an integer), got "
                  f"{json.dumps(answer, default=str)} ({type(answer).__name__}); write the "
                  "answer as the text a verifier should match, e.g. \"3\"")


def _row_problem(problem: Problem) -> str | None:
  for field in ("prompt", "answer", "solution"):
    if "\x00" in getattr(problem, field):
      return f"NUL byte in the {field}"
  if not problem.prompt.strip():
    return "empty prompt"
  if not problem.answer.strip():
    return "empty answer"
  return marker_problem(problem.prompt, problem.images)


def _invalid_rows(problems: list[Problem]) -> list[tuple[int, str]]:
  """(index, problem) of every row a run cannot learn from; every row of a prompt that is given
  two different answers counts (which one is right cannot be known)."""
  first, other = {}, {}  # row key -> its first row; a row with another answer than the first
  keys = [row_key(p) for p in problems]
  for i, (p, key) in enumerate(zip(problems, keys)):
    j = first.setdefault(key, i)
    if problems[j].answer != p.answer:
      other.setdefault(key, i)
  bad = []
  for i, (p, key) in enumerate(zip(problems, keys)):
    reason = _row_problem(p)
    if reason is None and key in other:
      j = other[key] if i == first[key] else first[key]
      same = "the same prompt and images" if p.images else "the same prompt"
      reason = (f"{same} as {where(problems[j])} with another answer ({p.answer!r} "
                f"here, {problems[j].answer!r} there)")
    if reason:
      bad.append((i, reason))
  return bad


def screen_rows(problems: list[Problem], policy: str = "error") -> tuple[list[Problem], int]:
  """``problems`` without the invalid rows (module docstring) and how many were left out;
  ``policy='error'`` raises on the first one instead."""
  if policy not in INVALID_ROWS:
    raise DataError(f"data.invalid_rows={policy!r}; allowed: {list(INVALID_ROWS)}")
  bad = _invalid_rows(problems)
  if not bad:
    return problems, 0
  index, reason = bad[0]
  if policy == "error":
    raise DataError(f"{where(problems[index])}: {reason}; fix the row, or set "
                    "data.invalid_rows='drop' to leave such rows out (counted)")
  logger.warning("data.invalid_rows='drop': left out %d of %d rows; first: %s: %s", len(bad),
                 len(problems), where(problems[index]), reason)
  dropped = {i for i, _ in bad}
  return [p for i, p in enumerate(problems) if i not in dropped], len(bad)


def _split_rows(problems: list[Problem], split: str) -> list[Problem]:
  if split not in SPLITS:
    raise DataError(f"split={split!r}; allowed: {SPLITS}")
  if split == "all":
    return problems
  want_eval = split == "eval"
  return [p for p in problems if is_eval_prompt(row_key(p)) == want_eval]


def _jsonl_files(path: str) -> list[str]:
  """The JSONL file and the image files its rows name (what a resumed run's data is)."""
  images = set()
  with open(path, "rb") as f:
    for raw in f:
      try:
        record = json.loads(raw)
      except ValueError:
        continue  # the file was read when the run started: no row is unreadable now
      refs = record.get("images") if isinstance(record, dict) else None
      refs = [refs] if isinstance(refs, (str, dict)) else refs or []
      images.update(p for p in (image_path(r, os.path.dirname(path)) for r in refs) if p)
  return [path] + sorted(images)


@register_data_source("jsonl", files=_jsonl_files)
def jsonl_source(path: str, settings) -> Rows:
  """``data.source='jsonl:PATH'``: one JSON object per line, string fields ``prompt`` and
  ``answer`` (``solution`` optional), screened by ``data.invalid_rows``."""
  rows, invalid = screen_rows(read_jsonl(path), settings["invalid_rows"])
  return Rows(rows, invalid_rows=invalid)


@register_data_source("hf", files=_dataset_files)
def hf_source(path: str, settings) -> Rows:
  """``data.source='hf:PATH'``: a local ``.jsonl``/``.json``/``.parquet`` file or a directory of
  them, read with Hugging Face ``datasets`` (nothing downloaded), screened by
  ``data.invalid_rows``."""
  rows, invalid = screen_rows(read_hf(path), settings["invalid_rows"])
  return Rows(rows, invalid_rows=invalid)


def _train_eval(opened: Rows) -> tuple[list[Problem], list[Problem]]:
  if opened.held_out is not None:
    return list(opened.rows), list(opened.held_out)
  return _split_rows(opened.rows, "train"), _split_rows(opened.rows, "eval")


def load_problems(source: str, *, split: str = "train", seed: int = 0, n: int | None = None,
                  settings=None, **overrides) -> list[Problem]:
  """A finite list of problems from ``source``; ``settings``: the ``data`` section (a config's
  ``c.data``; the declared defaults when None), ``overrides``: ``data`` keys by leaf name
  (``difficulty=2``, ``invalid_rows='drop'``; ``rljax.data.sources.data_settings``).

  Generated tasks need ``n`` (their train stream is infinite): ``split='train'`` gives the first
  ``n`` of stream ``seed``, ``'eval'`` the held-out set drawn with ``seed``. Finite sources give
  their rows of ``split`` (``'all'`` for every row) in order, the first ``n`` when ``n`` is set.
  """
  if split not in SPLITS:
    raise DataError(f"split={split!r}; allowed: {SPLITS}")
  opened = open_data_source(source, data_settings(settings, **overrides))
  if not isinstance(opened, Rows):
    if n is None or split not in ("train", "eval"):
      raise DataError(
          f"generated sources need n and split in ('train', 'eval'); got n={n}, split={split!r}")
    if split == "eval":
      return opened.eval_set(seed, n)
    return [opened.problem_at(seed, i) for i in range(n)]
  train, held = _train_eval(opened)
  rows = {"train": train, "eval": held, "all": train + held}[split]
  if split == "all" and opened.held_out is None:
    rows = list(opened.rows)  # file order
  return rows if n is None else rows[:n]


class PromptSource:
  """Training prompts in a resumable order, plus the eval set, for the RL loop.

  The train order is a pure function of ``(source, train_seed, position)``: embedded tasks index
  their stream directly; files are reshuffled every epoch with a seed derived from the epoch.
  ``state_dict()`` is therefore just the position, and a resumed run sees the same batches.
  """

  def __init__(self, source: str, *, train_seed: int = 0, eval_seed: int = 1,
               eval_source: str | None = None, settings=None, **overrides):
    """``settings``: the ``data`` section (the declared defaults when None); ``overrides``:
    ``data`` keys by leaf name (``difficulty=0``, ``invalid_rows='drop'``,
    ``reasoning_gym={...}``)."""
    self.source = source
    self.train_seed, self.eval_seed = train_seed, eval_seed
    self.position = 0
    settings = data_settings(settings, **overrides)
    opened = open_data_source(source, settings)
    self._task = None if isinstance(opened, Rows) else opened
    self.invalid_rows = 0  # rows left out by data.invalid_rows='drop'
    self._rows: list[Problem] = []
    self._eval_rows: list[Problem] = []
    if self._task is None:
      self.invalid_rows = opened.invalid_rows
      if eval_source and opened.held_out is None:
        self._rows = list(opened.rows)
      else:
        self._rows, self._eval_rows = _train_eval(opened)
      if not self._rows:
        raise DataError(f"data.source={source!r} has no training rows")
    if eval_source:
      held = open_data_source(eval_source, settings)
      if not isinstance(held, Rows):
        raise DataError(f"eval_source={eval_source!r} must be a finite source (rows, e.g. "
                        "jsonl: or hf:), not a generated task")
      self._eval_rows = list(held.rows) + list(held.held_out or ())
    self._epoch_order: tuple[int, list[int]] | None = None
    self._keep = lambda problem: True
    self.dropped_prompts = 0

  @property
  def shows_images(self) -> bool:
    """Whether its prompts show images (``Problem.images``): a generated task that states so, or
    any of its rows."""
    if self._task is not None:
      return bool(self._task.images)
    return any(p.images for p in self._rows + self._eval_rows)

  def set_prompt_filter(self, keep) -> None:
    """Leave out problems for which ``keep(problem)`` is False (``keep`` may raise instead: see
    ``rljax.data.prompt_policy``). File rows are filtered now, all of them (so a bad prompt is
    found at start-up); an embedded task's prompts as they are drawn. ``dropped_prompts`` counts
    what was left out."""
    self._keep = keep
    if self._task is None:
      before = len(self._rows) + len(self._eval_rows)
      self._rows = [p for p in self._rows if keep(p)]
      self._eval_rows = [p for p in self._eval_rows if keep(p)]
      self.dropped_prompts += before - len(self._rows) - len(self._eval_rows)
      self._epoch_order = None
      if not self._rows:
        raise DataError(f"data.source={self.source!r}: every training prompt was dropped as too "
                         "long (data.max_prompt_tokens, data.overlong_prompts)")

  def next_batch(self, n: int) -> list[Problem]:
    """The next ``n`` training problems; advances the position (past dropped ones too)."""
    batch = []
    while len(batch) < n:
      problem = self._train_problem(self.position)
      self.position += 1
      if self._task is None or self._keep(problem):
        batch.append(problem)
      else:
        self.dropped_prompts += 1
    return batch

  def _train_problem(self, position: int) -> Problem:
    if self._task is not None:
      return self._task.problem_at(self.train_seed, position)
    epoch, index = divmod(position, len(self._rows))
    if self._epoch_order is None or self._epoch_order[0] != epoch:
      order = list(range(len(self._rows)))
      random.Random(f"{self.source}/{self.train_seed}/{epoch}").shuffle(order)
      self._epoch_order = (epoch, order)
    return self._rows[self._epoch_order[1][index]]

  def eval_set(self, n: int) -> list[Problem]:
    """``n`` held-out problems (all of them when a file holds fewer)."""
    if self._task is not None:
      problems = self._task.eval_set(self.eval_seed, n)
      return [p for p in problems if self._keep(p)]
    if not self._eval_rows:
      raise DataError(
          f"data.source={self.source!r} has no eval rows: about 10% of the prompts are held out "
          "(by a hash of the prompt) and none of this file's were; the file needs more rows"
          + (" (or fewer were dropped as too long: data.overlong_prompts)"
             if self.dropped_prompts else ""))
    rows = list(self._eval_rows)
    random.Random(f"{self.source}/eval/{self.eval_seed}").shuffle(rows)
    return rows[:n]

  def observe(self, problems: list[Problem], correct) -> None:
    """The outcomes of a sampled round (``correct``: its rows, ``G`` per problem, in order): a
    source that chooses prompts by their history records them (``rljax.train.selective``); this
    one draws in a fixed order and ignores them."""

  def end_step(self) -> dict:
    """Called once per RL step after its last round: the metrics of the step's prompt choices
    (none here)."""
    return {}

  def state_dict(self) -> dict:
    """JSON-serialisable resume state."""
    return {"source": self.source, "train_seed": self.train_seed, "position": self.position}

  def load_state_dict(self, state: dict) -> None:
    """Continue at a saved position; refuses state saved for another source or seed."""
    for key in ("source", "train_seed"):
      if state[key] != getattr(self, key):
        raise DataError(
            f"prompt source state was saved with {key}={state[key]!r}, this run has "
            f"{key}={getattr(self, key)!r}: resuming would change the data order")
    self.position = int(state["position"])


def make_prompt_source(data, *, stream_seed: int | None = None,
                       takes_images: bool = False) -> PromptSource:
  """The ``PromptSource`` of the config's ``c.data`` section.

  ``stream_seed`` replaces ``data.train_seed`` for a separate stream of the same train split
  (e.g. the SFT cold start draws its examples apart from the RL prompts). ``takes_images``:
  whether the caller's policy and rollouts take images; when not, a source whose prompts show
  images is refused (its images would be dropped silently).
  """
  source = PromptSource(data.source,
                        train_seed=data.train_seed if stream_seed is None else stream_seed,
                        eval_seed=data.eval_seed, settings=data)
  if source.shows_images and not takes_images:
    raise DataError(f"data.source={data.source!r}: its prompts show images, and this run's "
                    "policy and rollouts take text only (a text-only model, or multi-turn "
                    "episodes): "
                    "use a vision-language policy (e.g. model.family='qwen2_5_vl') with "
                    "single-turn rollouts")
  return source

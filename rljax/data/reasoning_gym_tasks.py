"""reasoning-gym tasks as a prompt source: ``data.source='reasoning_gym:NAME[,NAME...]'``.

reasoning-gym (``pip install 'rljax[reasoning_gym]'``) ships ~100 procedural generators, each a
``ProceduralDataset`` whose item ``idx`` is a pure function of ``(settings, seed, idx)`` and whose
``score_answer(answer, entry)`` is the task's own verifier. Here each named task is built once with
``reasoning_gym.create_dataset(name, **settings)`` (``data.reasoning_gym.config``; seed 0 and the
library's default ``size`` unless the settings give them: the task's problem space is those
``size`` items), and a problem is drawn as the library's composite dataset does: a task by
``data.reasoning_gym.weights``, then an item of it.

Train/eval split: the draws come from ``rljax.data.tasks.Task``, so the train stream
(``data.train_seed``) never yields a held-out prompt and the eval set (``data.eval_seed``) only
held-out ones, split by a hash of the prompt text, whatever the seeds: the eval set is disjoint
from every training stream.

The prompt is ``data.reasoning_gym.template`` filled with the item's ``question`` and its metadata
fields (``'{question}'``: the library's own prompt; ``'{expression}='`` gives a character-level
model chain_sum's bare expression). The run's chat template is applied by the tokenizer
(``data.chat_template``) as for every source. The reference solution (SFT cold start) is
``'#<answer>'``. The answer is scored by the ``reasoning_gym`` reward (``rljax.rewards``), which
calls the task's ``score_answer`` on the completion's ``final_answer`` (the last
``<answer>...</answer>``, else the text after the last ``#``): the entry travels in
``Problem.meta['reasoning_gym']``, so the verifier worker needs nothing else.
"""
from __future__ import annotations

import difflib
import functools
import json
import random
import re

from rljax.config import conditions
from rljax.data.sources import register_data_source
from rljax.data.tasks import MARKER, Problem, Task, marked_answer
from rljax.errors import DataError, MissingPackageError

SOURCE_KIND = conditions.REASONING_GYM
NAMES_HELP = ("the names are the keys of reasoning_gym.factory.DATASETS "
              "(python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))') "
              "and the tasks of reasoning-gym's GALLERY.md")


def _library():
  """The reasoning-gym package (a heavy optional dependency: sympy, many generators)."""
  try:
    import reasoning_gym  # optional extra [reasoning_gym]: imported only by this source
  except ImportError:
    raise MissingPackageError("data.source='reasoning_gym:...' needs reasoning-gym: "
                      "pip install 'rljax[reasoning_gym]'") from None
  return reasoning_gym


def parse_weights(text: str, names: list[str]) -> dict[str, float]:
  """``'chain_sum=2,basic_arithmetic=1'`` -> ``{name: weight}``; ``''`` -> equal weights."""
  if not text.strip():
    return dict.fromkeys(names, 1.0)
  weights = {}
  for part in text.split(","):
    name, sep, value = (s.strip() for s in part.partition("="))
    try:
      weight = float(value) if sep else float("nan")
    except ValueError:
      weight = float("nan")
    if not weight > 0 or weight == float("inf"):
      raise DataError(f"data.reasoning_gym.weights={text!r}: {part.strip()!r} must be "
                      "'NAME=WEIGHT' with a positive weight, e.g. 'chain_sum=2,basic_arithmetic=1'")
    if name not in names:
      raise DataError(f"data.reasoning_gym.weights={text!r} names {name!r}, which is not a task "
                      f"of data.source (tasks: {names})")
    weights[name] = weight
  missing = [n for n in names if n not in weights]
  if missing:
    raise DataError(f"data.reasoning_gym.weights={text!r} gives no weight to {missing}: give "
                    "every task of data.source one, or leave it '' for equal weights")
  return weights


def parse_settings(text: str, names: list[str]) -> dict[str, dict]:
  """``data.reasoning_gym.config``: a JSON object ``{task: {setting: value}}`` -> that dict."""
  try:
    settings = json.loads(text)
  except json.JSONDecodeError as e:
    raise DataError(f"data.reasoning_gym.config={text!r} is not JSON ({e.msg}); write an object "
                    "like '{\"chain_sum\": {\"min_terms\": 2, \"max_terms\": 2}}'") from None
  if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
    raise DataError(f"data.reasoning_gym.config={text!r} must be a JSON object of objects, "
                    "{task: {setting: value}}")
  unknown = [n for n in settings if n not in names]
  if unknown:
    raise DataError(f"data.reasoning_gym.config sets {unknown[0]!r}, which is not a task of "
                    f"data.source (tasks: {names})")
  return settings


@functools.lru_cache(maxsize=None)
def _dataset(name: str, settings_json: str):
  """The task's ``ProceduralDataset`` built with its settings (seed 0 unless they give one)."""
  rg = _library()
  if name == "composite":
    raise DataError("data.source='reasoning_gym:composite': list the tasks instead "
                    "('reasoning_gym:chain_sum,gcd') and weight them in data.reasoning_gym.weights")
  if name not in rg.factory.DATASETS:
    close = difflib.get_close_matches(name, sorted(rg.factory.DATASETS), n=3)
    raise DataError(f"data.source names no reasoning-gym task {name!r}"
                    + (f" (did you mean {', '.join(close)}?)" if close else "")
                    + f"; {NAMES_HELP}")
  settings = {"seed": 0, **json.loads(settings_json)}
  try:
    return rg.create_dataset(name, **settings)
  except (TypeError, AssertionError, ValueError) as e:
    raise DataError(f"data.reasoning_gym.config for {name!r}: {settings} is refused by "
                    f"reasoning-gym ({type(e).__name__}: {e})") from None


class ReasoningGymTask(Task):
  """Problems drawn from one or more reasoning-gym tasks (module docstring).

  Args:
    names: the task names of ``data.source``.
    weights: ``{name: weight}``, every name.
    settings: ``{name: {setting: value}}`` passed to ``reasoning_gym.create_dataset``.
    template: the prompt, a ``str.format`` template over ``question`` and the metadata fields.
  """

  split_by_prompt = True
  marked_answer = True

  def __init__(self, names: tuple[str, ...], weights: dict[str, float],
               settings: dict[str, dict], template: str):
    self.name = f"{SOURCE_KIND}:{','.join(names)}"
    self.difficulty, self.level = 0, None  # rljax difficulty levels: not a reasoning-gym notion
    self.names, self.template = list(names), template
    self.weights = [weights[n] for n in names]
    self.settings = {n: settings.get(n, {}) for n in names}
    self.datasets = {n: _dataset(n, json.dumps(self.settings[n], sort_keys=True)) for n in names}
    for name in names:  # a template field the task does not have fails now, not at step 1
      self._prompt(name, self.datasets[name][0])

  def _prompt(self, name: str, entry: dict) -> str:
    fields = {**entry.get("metadata", {}), "question": entry["question"]}
    try:
      return self.template.format_map(fields)
    except (KeyError, IndexError, ValueError) as e:
      raise DataError(f"data.reasoning_gym.template={self.template!r} cannot be filled for task "
                      f"{name!r} ({type(e).__name__}: {e}); its fields: {sorted(fields)}") from None

  def sample(self, rng: random.Random) -> Problem:
    name = rng.choices(self.names, weights=self.weights, k=1)[0]
    dataset = self.datasets[name]
    entry = dataset[rng.randrange(len(dataset))]
    answer = str(entry["answer"])
    record = {"task": name, "settings": self.settings[name],
              "entry": {"question": entry["question"], "answer": entry["answer"],
                        "metadata": entry.get("metadata", {})}}
    return Problem(prompt=self._prompt(name, entry), answer=answer,
                   solution=f"{MARKER}{answer}", meta={SOURCE_KIND: record})

  def eval_set(self, seed: int, n: int) -> list[Problem]:
    try:
      return super().eval_set(seed, n)
    except ValueError as e:  # the tenth of a small problem space: its remedy is a larger size
      sizes = {name: len(d) for name, d in self.datasets.items()}
      raise DataError(f"data.num_eval={n}: {e}; the tasks' problem spaces are their "
                      f"generators' sizes {sizes}: set a larger 'size' in "
                      "data.reasoning_gym.config, or lower data.num_eval") from None

  def verify(self, completion: str, problem: Problem) -> float:
    return score_completion(completion, problem)

  def format_ok(self, completion: str) -> bool:
    return format_ok(completion)


def make_gym_task(names: str, weights: str = "", settings: str = "{}",
                  template: str = "{question}") -> ReasoningGymTask:
  """The task of ``data.source='reasoning_gym:<names>'`` and the ``data.reasoning_gym.*`` keys
  (cached: generators are built once per process; the package is checked on every call)."""
  _library()
  return _gym_task(names, weights, settings, template)


@functools.lru_cache(maxsize=None)
def _gym_task(names: str, weights: str, settings: str, template: str) -> ReasoningGymTask:
  task_names = [n.strip() for n in names.split(",")]
  if not all(task_names) or len(set(task_names)) != len(task_names):
    raise DataError(f"data.source='{SOURCE_KIND}:{names}' must name distinct tasks separated "
                    f"by commas, e.g. '{SOURCE_KIND}:chain_sum,basic_arithmetic'; {NAMES_HELP}")
  return ReasoningGymTask(tuple(task_names), parse_weights(weights, task_names),
                          parse_settings(settings, task_names), template)


@register_data_source(SOURCE_KIND, reads=tuple(
    f"data.{SOURCE_KIND}.{k}" for k in ("weights", "config", "template")))
def reasoning_gym_source(names: str, settings) -> ReasoningGymTask:
  """``data.source='reasoning_gym:NAME[,NAME...]'``: problems generated by reasoning-gym's tasks
  (an optional dependency, ``rljax[reasoning_gym]``), mixed by ``data.reasoning_gym.weights``,
  configured by ``.config``, posed by ``.template``."""
  gym = settings[SOURCE_KIND]
  return make_gym_task(names, gym["weights"], gym["config"], gym["template"])


_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def final_answer(completion: str) -> str | None:
  """The completion's answer: the last ``<answer>...</answer>`` (reasoning-gym's convention, as
  its ``utils.extract_answer``), else the text after the last ``MARKER``; None without either."""
  tagged = _ANSWER_TAG.findall(completion)
  if tagged:
    return tagged[-1].strip()
  return marked_answer(completion)


def format_ok(completion: str) -> bool:
  """Whether the completion gives an answer (tagged or marked), right or not."""
  return bool(final_answer(completion))


def score_completion(completion: str, problem: Problem) -> float:
  """The task's own ``score_answer`` of the completion's ``final_answer`` (the ``reasoning_gym``
  reward)."""
  return score_answer(final_answer(completion), problem)


def score_answer(answer: str | None, problem: Problem) -> float:
  """``score_answer(answer, entry)`` of the task that generated ``problem``: its own verifier
  (1.0 correct; some tasks give partial credit in [0, 1))."""
  record = problem.meta.get(SOURCE_KIND)
  if record is None:
    raise DataError("reward.fn='reasoning_gym' scores problems of "
                    "data.source='reasoning_gym:...' only; this one is not (meta: "
                    f"{sorted(problem.meta)})")
  dataset = _dataset(record["task"], json.dumps(record["settings"], sort_keys=True))
  return float(dataset.score_answer(answer, dict(record["entry"])))

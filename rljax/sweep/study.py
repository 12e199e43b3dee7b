"""Study files: what an ablation runs (variants x seeds on one base config) and compares.

A study is a Python file (``experiments/studies/<name>.py``) whose ``get_study()`` returns a
:class:`Study`::

  from rljax.sweep.study import Study, ladder

  def get_study():
    return Study(
        name="dapo_ladder",
        config="configs/studies/arith_l1_grpo.py",
        variants=ladder([("grpo", {}),
                         ("+overlong_filter", {"algo.overlong_filter": True}), ...]),
        seeds=(0, 1, 2),
        metrics=("final_accuracy", "auc_accuracy", "final_len_wrong"),
        baseline="grpo")

Overrides are ``--config.KEY=VALUE`` pairs of the normal CLI: values may be written as strings
(as on the command line) or as Python values (bools, numbers, None, tuples), which are rendered
the way ``rljax.config.loader.parse_value`` reads them back.
"""
from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Any, Iterable, Mapping, Sequence

from rljax.config import loader as config_loader
from rljax.errors import RljaxError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Summary metrics a study may compare (rljax.sweep.aggregate.run_summary defines each).
SUMMARY_METRICS = (
    "final_accuracy", "gain_accuracy", "best_accuracy", "auc_accuracy", "final_entropy",
    "final_len_mean",
    "final_len_correct", "final_len_wrong", "final_truncation_rate", "mean_truncation_rate",
    "wall_time_s", "generated_samples", "gain_per_1k_samples",
)


class StudyError(RljaxError, ValueError):
  """A study file, its options or its runs' directories the sweep cannot use (the message says
  what to change): one line and exit status 2 on the command line."""


@dataclasses.dataclass(frozen=True)
class Variant:
  """One arm of a study: a name (used as its directory) and its complete override set."""
  name: str
  overrides: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Study:
  """An ablation: every variant runs once per seed on ``config`` plus its overrides.

  Attributes:
    name: directory name of the study (``<root>/<name>/<variant>/seed<k>``).
    config: base config file, absolute or relative to the repository root (or the cwd).
    variants: the arms, in table order (see :func:`ladder` and :func:`independent`).
    seeds: values of ``seed`` (and ``data.train_seed``: the data order) of the runs.
    metrics: the summary metrics of the table and CSV, names in ``SUMMARY_METRICS``.
    baseline: the variant every other one is compared with, paired by seed.
    overrides: applied to every run before the variant's own (e.g. ``train.steps``).
    description: one paragraph for the report: the claim under test.
  """
  name: str
  config: str
  variants: tuple[Variant, ...]
  seeds: tuple[int, ...]
  metrics: tuple[str, ...]
  baseline: str
  overrides: tuple[tuple[str, str], ...] = ()
  description: str = ""

  def __post_init__(self):
    try:
      object.__setattr__(self, "variants", tuple(self.variants))
      object.__setattr__(self, "seeds", tuple(_seed(s) for s in self.seeds))
    except TypeError:
      raise StudyError(f"study {self.name!r}: variants and seeds must be sequences, got "
                       f"{self.variants!r} and {self.seeds!r}") from None
    if isinstance(self.metrics, str):  # one name, not its letters
      object.__setattr__(self, "metrics", (self.metrics,))
    object.__setattr__(self, "metrics", tuple(self.metrics))
    object.__setattr__(self, "overrides", overrides_of(self.overrides))
    _validate(self)

  def variant(self, name: str) -> Variant:
    for v in self.variants:
      if v.name == name:
        return v
    raise StudyError(f"study {self.name!r} has no variant {name!r}; "
                   f"variants: {[v.name for v in self.variants]}")

  def config_path(self) -> str:
    return resolve_config_path(self.config)


def _seed(value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise StudyError(f"seed {value!r} ({type(value).__name__}) is not an integer")
  return int(value)


def cli_value(value: Any) -> str:
  """A Python value as ``--config.KEY=VALUE`` text that ``config_loader.parse_value`` reads back."""
  if isinstance(value, str):
    return value
  if isinstance(value, bool):
    return "true" if value else "false"
  if value is None:
    return "none"
  if isinstance(value, (int, float)):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  raise StudyError(f"override value {value!r} ({type(value).__name__}) is not a config value; "
                  "use str, bool, int, float, None or a tuple")


def overrides_of(items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> tuple[tuple[str, str], ...]:
  """A dict or pair list of overrides as ordered ``(key, text)`` pairs."""
  pairs = items.items() if isinstance(items, Mapping) else items
  return tuple((str(k), cli_value(v)) for k, v in pairs)


def independent(arms: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[Variant, ...]:
  """Variants that each apply only their own overrides to the base config."""
  return tuple(Variant(name, overrides_of(o)) for name, o in arms)


def ladder(rungs: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[Variant, ...]:
  """Cumulative variants: rung k applies the overrides of rungs 0..k in order (a later rung may
  change a key an earlier one set), as in DAPO's table 1 or VAPO's ablation."""
  variants, acc = [], {}
  for name, o in rungs:
    acc.update(dict(overrides_of(o)))
    variants.append(Variant(name, tuple(acc.items())))
  return tuple(variants)


def resolve_config_path(path: str) -> str:
  """An absolute config path: ``path`` itself, or relative to the cwd, or to the repository."""
  for candidate in (path, os.path.join(REPO_ROOT, path)):
    if os.path.isfile(candidate):
      return os.path.abspath(candidate)
  raise StudyError(f"study config {path!r} found neither relative to the cwd nor to "
                          f"{REPO_ROOT}")


def load_study(path: str) -> Study:
  """Import a study file and return its validated ``get_study()``."""
  study = config_loader.call_file_function(path, "get_study", kind="study")
  if not isinstance(study, Study):
    raise StudyError(f"{path}: get_study() must return rljax.sweep.study.Study, got "
                    f"{type(study).__name__}")
  return study


def variant_config(study: Study, variant: Variant, extra: Iterable[tuple[str, str]] = ()):
  """The locked config of ``variant`` (seed not yet applied): base + study + variant + extra."""
  return config_loader.load_config(study.config_path(),
                                   list(study.overrides) + list(variant.overrides) + list(extra))


def _validate(study: Study) -> None:
  strays = [v for v in study.variants if not isinstance(v, Variant)]
  if strays:
    raise StudyError(f"study {study.name!r}: variants must be Variant records (made by "
                     f"independent() or ladder()), got {strays[0]!r}")
  names = [v.name for v in study.variants]
  if not names:
    raise StudyError(f"study {study.name!r}: variants is empty")
  if len(set(names)) != len(names):
    raise StudyError(f"study {study.name!r}: variant names repeat: {names}")
  for name in names + [study.name]:
    if not name or "/" in name or name.startswith(".") or name.startswith("_"):
      raise StudyError(f"study {study.name!r}: {name!r} cannot be a directory name (no '/', "
                       "not empty, not starting with '.' or '_')")
  if study.baseline not in names:
    raise StudyError(f"study {study.name!r}: baseline {study.baseline!r} is not a variant; "
                     f"variants: {names}")
  if not study.seeds or len(set(study.seeds)) != len(study.seeds):
    raise StudyError(f"study {study.name!r}: seeds must be distinct and non-empty, got "
                     f"{study.seeds}")
  unknown = [m for m in study.metrics if m not in SUMMARY_METRICS]
  if unknown or not study.metrics:
    raise StudyError(f"study {study.name!r}: metrics {unknown or '()'} are not summary metrics; "
                     f"allowed: {list(SUMMARY_METRICS)}")
  reserved = {"seed", "data.train_seed", "train.run_dir", "train.resume", "sft.out_dir"}
  for source, pairs in [("overrides", study.overrides)] + [
      (f"variant {v.name!r}", v.overrides) for v in study.variants]:
    clash = sorted(reserved & {k for k, _ in pairs})
    if clash:
      raise StudyError(f"study {study.name!r}: {source} sets {clash}, which the sweep sets per "
                       "run (seed, data order, run and cold-start directories)")

"""The reward-composition language of ``reward.*`` keys (docs/reward_models.md): parsed here,
composed by ``rljax.rewards.sources``.

``reward.sources='verifier:1.0,judge:0.5'`` names weighted reward sources; ``reward.normalize`` and
``reward.clip`` name per-source normalisation and clipping; the judge's template and pattern are
checked here too. Pure parsing: a bad value is a ``ValueError`` naming the term.
"""
from __future__ import annotations

import re
import string

from rljax.config.declare import When, parsed, registered, registry_names

# The task's own source: it always runs (its correct flags are the run's accuracy and eval's
# pass@1) and is the whole reward when reward.sources is ''.
VERIFIER_SOURCE, ENV_SOURCE = "verifier", "env"  # single-turn rollouts, multi-turn episodes
NORMALIZATIONS = ("whiten",)


def _terms(text, fields: str) -> list:
  """``'a:x,b:y'`` -> ``[('a', ['x']), ('b', ['y'])]``: each term a name and the ``fields``
  (e.g. ``'weight'``, ``'lo:hi'``) after it; every name once. ValueError names the bad term."""
  if not isinstance(text, str):
    raise ValueError(f"got {type(text).__name__} {text!r}, not a string")
  width = len(fields.split(":"))
  terms, seen = [], set()
  for term in (t.strip() for t in text.split(",")) if text.strip() else ():
    name, *rest = [part.strip() for part in term.split(":")]
    if not name or len(rest) != width:
      raise ValueError(f"term {term!r} is not 'name:{fields}'")
    if name in seen:
      raise ValueError(f"{name!r} is named twice")
    seen.add(name)
    terms.append((name, rest))
  return terms


def _number(text: str, term: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise ValueError(f"{term}: {text!r} is not a number") from None
  if value != value or value in (float("inf"), float("-inf")):
    raise ValueError(f"{term}: {text!r} is not finite")
  return value


def reward_weights(text: str) -> dict:
  """``reward.sources``: ``'verifier:1.0,judge:0.5'`` -> ``{'verifier': 1.0, 'judge': 0.5}``
  (``''`` -> ``{}``: the task's own source alone). Names must be registered reward sources."""
  weights = {name: _number(w, f"weight of {name!r}") for name, (w,) in _terms(text, "weight")}
  if weights:
    known = registry_names("reward_source")
    unknown = [n for n in weights if n not in known]
    if unknown:
      raise ValueError(f"{unknown[0]!r} is not a registered reward source; registered: "
                       f"{', '.join(known)}")
    if not any(weights.values()):
      raise ValueError("every weight is 0: nothing would be optimised")
  return weights


def reward_normalize(text: str) -> dict:
  """``reward.normalize``: ``'judge:whiten'`` -> ``{'judge': 'whiten'}``."""
  out = {name: how for name, (how,) in _terms(text, "how")}
  for name, how in out.items():
    if how not in NORMALIZATIONS:
      raise ValueError(f"{name}:{how}: the normalisation must be one of {list(NORMALIZATIONS)}")
  return out


def reward_clip(text: str) -> dict:
  """``reward.clip``: ``'rm:-5:5'`` -> ``{'rm': (-5.0, 5.0)}`` (after whitening, if any)."""
  out = {}
  for name, (lo, hi) in _terms(text, "lo:hi"):
    lo, hi = _number(lo, f"{name} lo"), _number(hi, f"{name} hi")
    if not lo < hi:
      raise ValueError(f"{name}:{lo}:{hi} needs lo < hi")
    out[name] = (lo, hi)
  return out


def task_source(f) -> str:
  """The task's own reward source: the verifier, or the environment of multi-turn episodes."""
  return VERIFIER_SOURCE if f["env.name"] is None else ENV_SOURCE


def composed_sources(f) -> dict:
  """``{name: weight}`` of the run's reward: ``reward.sources``, or the task's source alone."""
  return reward_weights(f["reward.sources"]) or {task_source(f): 1.0}


def judge_template(text) -> str:
  """``reward.judge.template``: a ``str.format`` template naming ``{prompt}`` and
  ``{completion}`` and nothing else (literal braces doubled)."""
  if not isinstance(text, str):
    raise ValueError(f"got {type(text).__name__}, not a string")
  try:
    fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
  except ValueError as e:
    raise ValueError(f"not a format template ({e})") from None
  missing = {"prompt", "completion"} - fields
  if missing or fields - {"prompt", "completion"}:
    raise ValueError(f"it names {sorted(fields) or 'no field'}; expected exactly {{prompt}} and "
                     "{completion}")
  return text


def judge_pattern(text) -> str:
  """``reward.judge.pattern``: a regular expression whose first match is read as a number."""
  try:
    re.compile(text)
  except (re.error, TypeError) as e:
    raise ValueError(f"not a regular expression ({e})") from None
  return text


def named_source(name: str) -> When:
  """``reward.sources`` names the source ``name`` (its keys are read only then)."""
  return When(lambda f, k: name in composed_sources(f), f"'{name}' in reward.sources",
              lambda f, k: f"reward.sources={f['reward.sources']!r} does not name '{name}'")
REWARD_MODEL_SOURCE = "rm"  # the learned scalar reward model (rljax.rewards.reward_model)

"""Start-up validation: every key checked against its declaration before anything is built.

``check_config(config)`` is a pure function of the config: it raises one ``ConfigError`` naming
the key, its value and what is allowed, or returns None. It runs in well under a second (no model,
no data, no compilation), so a typo or a negative epsilon costs a second, not an SFT run and an
eval. What each key allows is declared once, in ``rljax/defaults.py`` (``KEYS``); this module
adds only the constraints between keys. A key absent from the config is skipped (a config saved
by an older version).
"""
from __future__ import annotations

from rljax.data.reasoning_gym_tasks import SOURCE_KIND as GYM_SOURCE
from rljax.defaults import KEYS
from rljax.errors import RljaxError, UnknownNameError


class ConfigError(RljaxError, ValueError):
  """A config value outside what the key allows (the message names the key)."""


class UnknownComponentError(ConfigError, UnknownNameError):
  """A key names no registered component (the message lists the registered names)."""


def check_section(section: str, values) -> None:
  """The declared checks of one section (e.g. ``algo``) on a mapping of its keys, for callers
  that hold only that section (``rljax.algos.resolve`` of an ``algo`` dict)."""
  for key in KEYS:
    if key.section == section and (leaf := key.name[len(section) + 1:]) in values:
      if (allowed := key.check(values[leaf])) is not None:
        raise _fail(key.name, values[leaf], allowed)


def _lookup(config, dotted: str):
  node = config
  for part in dotted.split("."):
    if part not in node:
      return False, None
    node = node[part]
  return True, node


def _fail(key: str, value, allowed: str) -> ConfigError:
  from rljax.defaults import KEY_BY_NAME
  error = UnknownComponentError if KEY_BY_NAME[key].check.family else ConfigError
  return error(f"{key}={value!r} is not allowed: expected {allowed}")


def check_config(config) -> None:
  """Raise ``ConfigError`` (one line: key, value, what is allowed) for the first bad value."""
  for key in KEYS:
    present, value = _lookup(config, key.name)
    if present and (allowed := key.check(value)) is not None:
      raise _fail(key.name, value, allowed)
  _check_relations(config)


def _check_relations(config) -> None:
  """Constraints between keys."""
  from rljax.parallel.mesh import AXES  # the mesh's axes; the section's other keys place devices
  fill = [f"mesh.{axis}" for axis in AXES if _lookup(config, f"mesh.{axis}") == (True, -1)]
  if len(fill) > 1:
    raise ConfigError(f"only one mesh axis may be -1 (the devices the others leave), got "
                      f"{', '.join(fill)}")
  m = config.model
  if m.source in ("tiny", "sft") and m.hidden_size % m.num_heads:
    raise ConfigError(f"model.hidden_size={m.hidden_size} must be a multiple of "
                      f"model.num_heads={m.num_heads}")
  if m.source in ("tiny", "sft") and m.num_heads % m.num_kv_heads:
    raise ConfigError(f"model.num_heads={m.num_heads} must be a multiple of "
                      f"model.num_kv_heads={m.num_kv_heads}")
  r = config.rollout
  rows = r.prompts_per_step * r.group_size
  a = config.algo
  if rows % (a.minibatches * a.micro_batches):
    raise ConfigError(
        f"rollout.prompts_per_step x rollout.group_size = {rows} rows do not split into "
        f"algo.minibatches={a.minibatches} x algo.micro_batches={a.micro_batches} equal parts")
  if "teacher" in config and a.opd_coef > 0 and not config.teacher.source:
    raise ConfigError(f"algo.opd_coef={a.opd_coef!r} needs a distillation teacher: set "
                      "teacher.source ('hf:PATH', 'run:DIR', 'sft' or 'tiny')")
  _check_inflight(config)
  if ("data" in config and "reward" in config and config.reward.fn == GYM_SOURCE
      and not config.data.source.startswith(GYM_SOURCE + ":")):
    raise ConfigError(f"reward.fn={GYM_SOURCE!r} scores problems of data.source="
                      f"'{GYM_SOURCE}:NAME' only (it calls the generating task's scorer); "
                      f"data.source={config.data.source!r}")
  if r.group_size == 1 and needs_groups(config.algo):
    raise ConfigError(
        f"rollout.group_size=1 with algo.advantage={a.advantage!r}"
        + (f" (adv_std={a.adv_std!r})" if a.advantage == "grpo" else "")
        + ": this estimator's baseline comes from the other completions of the prompt; "
        "use rollout.group_size >= 2")


def _check_inflight(config) -> None:
  """``rollout.inflight_chunk`` needs an asynchronous sampler and a single-turn rollout whose
  record it can join across chunks."""
  r = config.rollout
  chunk = r.get("inflight_chunk", 0)
  if not chunk:
    return
  from rljax.algos.usage import UnusedKeyError
  if not r.max_staleness:
    raise UnusedKeyError(f"rollout.inflight_chunk={chunk} is not used: the synchronous loop "
                         "(rollout.max_staleness=0) gets new weights only between steps; set "
                         "rollout.max_staleness >= 1")
  if chunk >= r.max_new_tokens:
    raise UnusedKeyError(f"rollout.inflight_chunk={chunk} is not used: a rollout of "
                         f"rollout.max_new_tokens={r.max_new_tokens} is one chunk")
  if "env" in config and config.env.name:
    raise ConfigError(f"rollout.inflight_chunk={chunk}: multi-turn episodes "
                      f"(env.name={config.env.name!r}) take new weights between steps only")
  if config.model.get("router_replay") == "R3":
    raise ConfigError(f"rollout.inflight_chunk={chunk} with model.router_replay='R3': the "
                      "sampler's experts are not joined across chunks; use 'R2' or 'off'")


def needs_groups(algo_cfg) -> bool:
  """Whether ``algo.advantage`` needs groups of at least 2 completions: its registered estimator
  reads ``group_size`` and declares no smaller minimum (``min_group_size``). An unknown name is
  left to ``rljax.algos.resolve``, which lists the registered ones."""
  from rljax.algos.registry import ADVANTAGES
  if algo_cfg.advantage not in ADVANTAGES:
    return False
  meta = ADVANTAGES.meta(algo_cfg.advantage)
  return "group_size" in meta["inputs"] and meta.get("min_group_size", 2) > 1


def check_eval_samples(samples) -> None:
  """``rljax eval --samples K``: K >= 1."""
  if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
    raise ConfigError(f"eval --samples={samples!r} is not allowed: expected an integer >= 1")

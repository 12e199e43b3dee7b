"""Start-up validation: every numeric key range-checked before anything is built.

``check_config(config)`` is a pure function of the config: it raises one ``ConfigError`` naming
the key, its value and what is allowed, or returns None. It runs in well under a second (no model,
no data, no compilation), so a typo or a negative epsilon costs a second, not an SFT run and an
eval. Registry names (advantage, objective, reward fn, ...) are resolved by the trainer's own
start-up; this module checks values.

Each rule is ``(dotted key, check)`` where a check returns None when the value is allowed or the
text of what is allowed. A key absent from the config is skipped (a config saved by an older
version); ``tests/reliability/test_config_checks.py`` asserts that every rule names a key of
``configs/base.py``.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable

from rljax.errors import RljaxError

Check = Callable[[Any], "str | None"]


class ConfigError(RljaxError, ValueError):
  """A config value outside what the key allows (the message names the key)."""


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def integer(lo: int | None = None, hi: int | None = None, *, optional: bool = False,
            also: tuple = ()) -> Check:
  """An integer in ``[lo, hi]`` (either bound may be None), or one of ``also``."""
  def check(value):
    if (optional and value is None) or value in also and _is_int(value):
      return None
    if not _is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
      bounds = " and ".join(b for b in ((f">= {lo}" if lo is not None else ""),
                                         (f"<= {hi}" if hi is not None else "")) if b)
      extra = "".join(f" or {a}" for a in also)
      return f"an integer{' ' + bounds if bounds else ''}{extra}" + (" (or None)" if optional
                                                                      else "")
    return None
  return check


def real(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
         hi_open: bool = False, optional: bool = False) -> Check:
  """A finite real in the interval (open ends where ``*_open``); None allowed if ``optional``."""
  def check(value):
    if optional and value is None:
      return None
    ok = _is_real(value) and math.isfinite(value)
    if ok and lo is not None:
      ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
      ok = value < hi if hi_open else value <= hi
    if ok:
      return None
    left = "" if lo is None else ("(" if lo_open else "[") + f"{lo}"
    right = "" if hi is None else f"{hi}" + (")" if hi_open else "]")
    where = (f" in {left or '(-inf'}, {right or 'inf)'}" if (lo is not None or hi is not None)
             else "")
    return f"a finite number{where}" + (" (or None)" if optional else "")
  return check


def choice(*options: str) -> Check:
  def check(value):
    return None if value in options else f"one of {list(options)}"
  return check


def nonempty_string(value):
  return None if isinstance(value, str) and value.strip() else "a non-empty string"


def pass_rate_window(value):
  if value is None:
    return None
  if (isinstance(value, (tuple, list)) and len(value) == 2 and all(map(_is_real, value))
      and 0 <= value[0] <= value[1] <= 1):
    return None
  return "None or (lo, hi) with 0 <= lo <= hi <= 1"


POSITIVE = real(0, lo_open=True)
NONNEG = real(0)
FRACTION = real(0, 1)
ADAM_BETA = real(0, 1, hi_open=True)
SEED = integer(0, 2**32 - 1)  # PRNGKey and numpy take seeds as C integers
SIZE = integer(1, 2**20)  # a model dimension; larger ones overflow int32 shapes and never fit

RULES: tuple[tuple[str, Check], ...] = (
    ("seed", SEED), ("data.train_seed", SEED), ("data.eval_seed", SEED),
    ("model.hidden_size", SIZE), ("model.intermediate_size", SIZE),
    ("model.num_layers", SIZE), ("model.num_heads", SIZE),
    ("model.num_kv_heads", SIZE), ("model.rope_theta", POSITIVE),
    ("model.dtype", choice("float32", "bfloat16", "float16")),
    ("model.param_dtype", choice("float32", "bfloat16", "float16")),
    ("model.matmul_precision", choice("default", "high", "highest")),
    ("model.logits_chunk", integer(1)), ("model.forward_tokens", integer(-1)),
    ("model.attention", choice("auto", "xla", "blockwise", "cudnn", "pallas")),
    ("model.attention_block", integer(1)),
    ("rollout.max_concurrent_rows", integer(0)), ("rollout.kv_cache_bytes", integer(0)),
    ("rollout.dtype", choice(None, "float32", "bfloat16", "float16")),
    ("model.remat", choice("none", "full", "dots", True, False, "True", "False", "true", "false")),
    ("model.scan_layers", choice(True, False)),
    ("data.difficulty", integer(0)), ("data.num_eval", integer(1)),
    ("data.prompt_bucket", integer(1)), ("data.max_prompt_tokens", integer(0)),
    ("data.overlong_prompts", choice("error", "drop")),
    ("data.invalid_rows", choice("error", "drop")),
    ("data.source", nonempty_string), ("data.tokenizer", nonempty_string),
    ("rollout.prompts_per_step", integer(1)), ("rollout.group_size", integer(1)),
    ("rollout.max_new_tokens", integer(1)), ("rollout.temperature", POSITIVE),
    ("rollout.top_k", integer(0)), ("rollout.top_p", real(0, 1, lo_open=True)),
    ("rollout.min_p", real(0, 1, hi_open=True)),
    ("reward.format_weight", real()), ("reward.wrong_value", real()),
    ("reward.overlong_buffer", integer(0)), ("reward.overlong_penalty", NONNEG),
    ("reward.timeout_s", POSITIVE), ("reward.workers", integer(1)),
    ("reward.max_logged_failures", integer(0)),
    ("algo.gamma", FRACTION), ("algo.lam", FRACTION),
    ("algo.lam_critic", real(0, 1, optional=True)), ("algo.lam_alpha", real(0, optional=True)),
    ("algo.clip_eps_low", real(0, 1)), ("algo.clip_eps_high", NONNEG),
    ("algo.dual_clip_c", real(1, lo_open=True, optional=True)),
    ("algo.cispo_eps_high", NONNEG), ("algo.cispo_eps_low", real(0, optional=True)),
    ("algo.gmpo_eps", NONNEG),
    ("algo.loss_norm_constant", real(0, lo_open=True, optional=True)),
    ("algo.kl_coef", NONNEG), ("algo.kl_target", real(0, lo_open=True, optional=True)),
    ("algo.kl_horizon", integer(1)), ("algo.ref_ema_decay", FRACTION),
    ("algo.entropy_coef", real()), ("algo.pos_lm_coef", NONNEG),
    ("algo.max_gen_batches", integer(1)), ("algo.keep_pass_rate", pass_rate_window),
    ("algo.epochs", integer(1)), ("algo.minibatches", integer(1)),
    ("algo.micro_batches", integer(1)), ("algo.tis_cap", real(0, lo_open=True, optional=True)),
    ("algo.sapo_tau_pos", POSITIVE), ("algo.sapo_tau_neg", POSITIVE),
    ("algo.sapo_level", choice("token", "sequence")),
    ("algo.clip_cov_ratio", real(0, 1, lo_open=True)), ("algo.clip_cov_lb", real()),
    ("algo.clip_cov_ub", real()), ("algo.kl_cov_ratio", real(0, 1, lo_open=True)),
    ("algo.kl_cov_coef", NONNEG), ("algo.passk_k", integer(1, optional=True)),
    ("algo.rollout_is", choice("none", "token", "sequence", "geometric")),
    ("algo.rollout_is_cap", POSITIVE), ("algo.rollout_is_floor", real(0, optional=True)),
    ("algo.rollout_rs", choice("none", "token", "sequence", "geometric")),
    ("algo.rollout_rs_lo", real(0, optional=True)),
    ("algo.rollout_rs_hi", real(0, optional=True)),
    ("algo.rollout_rs_veto", real(0, lo_open=True, optional=True)),
    ("algo.rollout_rs_k3", real(0, optional=True)),
    ("algo.entropy_top_rho", NONNEG), ("algo.entropy_mask_source", choice("old", "current")),
    ("algo.entropy_target", real()), ("algo.entropy_coef_delta", NONNEG),
    ("algo.entropy_coef_min", real()), ("algo.entropy_coef_max", real()),
    ("algo.entropy_ctrl_estimate", choice("full", "sampled")),
    ("algo.opd_coef", NONNEG), ("algo.opd_discount", FRACTION),
    ("algo.opd_student_logp", choice("old", "sampler")),
    ("teacher.dtype", choice("", "float32", "bfloat16", "float16")),
    ("critic.lr", POSITIVE), ("critic.value_clip", NONNEG), ("critic.pretrain_steps", integer(0)),
    ("optim.lr", POSITIVE), ("optim.warmup_steps", integer(0)),
    ("optim.schedule", choice("constant", "cosine")), ("optim.weight_decay", NONNEG),
    ("optim.b1", ADAM_BETA), ("optim.b2", ADAM_BETA), ("optim.eps", POSITIVE),
    ("optim.max_grad_norm", NONNEG),
    ("train.steps", integer(1)), ("train.eval_every", integer(0)),
    ("train.checkpoint_every", integer(0)), ("train.keep_checkpoints", integer(1)),
    ("train.run_dir", nonempty_string), ("train.max_skipped_steps", integer(0)),
    ("sft.steps", integer(1)), ("sft.batch_size", integer(1)), ("sft.lr", POSITIVE),
    ("sft.warmup_steps", integer(0)), ("sft.seed", SEED), ("sft.out_dir", nonempty_string),
    # any one axis may be -1: the devices the other two leave (rljax.parallel.mesh)
    ("mesh.data", integer(1, also=(-1,))), ("mesh.fsdp", integer(1, also=(-1,))),
    ("mesh.tensor", integer(1, also=(-1,))),
    ("dist.mode", choice("auto", "off")),
)


def _lookup(config, dotted: str):
  node = config
  for part in dotted.split("."):
    if part not in node:
      return False, None
    node = node[part]
  return True, node


def _fail(key: str, value, allowed: str) -> ConfigError:
  return ConfigError(f"{key}={value!r} is not allowed: expected {allowed}")


def check_config(config) -> None:
  """Raise ``ConfigError`` (one line: key, value, what is allowed) for the first bad value."""
  for key, check in RULES:
    present, value = _lookup(config, key)
    if present and (allowed := check(value)) is not None:
      raise _fail(key, value, allowed)
  _check_relations(config)


def _check_relations(config) -> None:
  """Constraints between keys."""
  fill = [f"mesh.{k}" for k in ("data", "fsdp", "tensor") if config.mesh[k] == -1]
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
  if r.group_size == 1 and needs_groups(config.algo):
    raise ConfigError(
        f"rollout.group_size=1 with algo.advantage={a.advantage!r}"
        + (f" (adv_std={a.adv_std!r})" if a.advantage == "grpo" else "")
        + ": this estimator's baseline comes from the other completions of the prompt; "
        "use rollout.group_size >= 2")


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
  if not _is_int(samples) or samples < 1:
    raise ConfigError(f"eval --samples={samples!r} is not allowed: expected an integer >= 1")

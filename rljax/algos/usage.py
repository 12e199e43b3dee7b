"""No key is silently ignored: every ``algo.*``, ``critic.*`` and ``reward.*`` key that differs
from its default must be read by what the config resolved to, or the run stops naming the key and
what would read it (``algo.dual_clip_c=3.0 is not used by policy_loss 'cispo'; read by policy_loss
'gspo', 'ppo'``).

What reads a key: a bound component's hyperparameters (``Bound.keys``, less the ones its
registration's ``ignored_keys(settings)`` says another setting overrides), a regulariser's
coefficient, a resolved transform's ``keys``, and the few switches below that the trainer itself
reads under a condition.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Tuple

from rljax.algos.registry import ADVANTAGES, LOSS_AGGS, POLICY_LOSSES, REGULARIZERS
from rljax.config_checks import ConfigError
from rljax.defaults import KEY_BY_NAME

# Keys every algorithm reads.
ALWAYS = ("advantage", "policy_loss", "kl_placement", "overlong_filter", "dynamic_sampling",
          "epochs", "minibatches", "micro_batches")


def _agg_modes(algorithm) -> set:
  return {algorithm.policy_agg} | {r.agg for r in algorithm.regularizers}


# key -> (is it read by this algorithm, the condition under which it is read)
Condition = Tuple[Callable[[Mapping[str, Any], Any], bool], str]
CONDITIONAL: Dict[str, Condition] = {
    "kl_estimator": (lambda a, alg: alg.kl_placement is not None, "algo.kl_placement != 'none'"),
    "ref_update": (lambda a, alg: alg.kl_placement is not None, "algo.kl_placement != 'none'"),
    "ref_ema_decay": (lambda a, alg: alg.kl_placement is not None and alg.ref_mode == "ema",
                      "algo.ref_update='ema' with a KL term"),
    "kl_normalize": (lambda a, alg: alg.kl_placement == "loss", "algo.kl_placement='loss'"),
    "max_gen_batches": (lambda a, alg: a["dynamic_sampling"], "algo.dynamic_sampling=True"),
    "keep_pass_rate": (lambda a, alg: a["dynamic_sampling"], "algo.dynamic_sampling=True"),
    "adv_whiten": (lambda a, alg: not ADVANTAGES.meta(a["advantage"]).get("whitened"),
                   "an estimator that does not whiten by definition"),
    "loss_agg": (lambda a, alg: not POLICY_LOSSES.meta(a["policy_loss"]).get("loss_agg"),
                 "an objective that does not force its own aggregation"),
    "loss_norm_constant": (lambda a, alg: "seq_mean_token_sum_norm" in _agg_modes(alg),
                           "algo.loss_agg='seq_mean_token_sum_norm'"),
}
CRITIC_KEYS = ("lr", "value_clip", "pretrain_steps")  # read with critic.enabled=True
# train.* keys -> the loggers (train.loggers) that read them (rljax.train.trackers).
TRACKER_KEYS = {"tracker_project": ("wandb", "mlflow"), "tracker_run_name": ("wandb", "mlflow"),
                "tracker_group": ("wandb", "mlflow"), "tracker_tags": ("wandb", "mlflow"),
                "mlflow_tracking_uri": ("mlflow",)}


class UnusedKeyError(ConfigError):
  """A key differs from its default and nothing the config resolved to reads it."""


def algo_keys_read(algo: Mapping[str, Any], algorithm) -> set:
  """The ``algo.*`` keys (leaf names) the resolved ``algorithm`` reads."""
  read = set(ALWAYS)
  for registry, bound in ((ADVANTAGES, algorithm.advantage), (POLICY_LOSSES, algorithm.objective)):
    ignored = registry.meta(bound.name).get("ignored_keys")  # read, but overridden by another
    read |= set(bound.keys) - (ignored(algo) if ignored else set())
  for reg in algorithm.regularizers:
    read |= set(reg.values.keys) | {reg.coef}
  for t in algorithm.transforms:
    read |= set(t.keys)
  read |= {key for key, (reads, _) in CONDITIONAL.items() if reads(algo, algorithm)}
  return read


def readers(key: str) -> list:
  """Everything that could read ``algo.<key>``, for the error message."""
  from rljax.transforms import TRANSFORMS
  found = [f"{'regulariser' if reg is REGULARIZERS else reg.config_key[5:]} '{name}'"
           for reg in (ADVANTAGES, POLICY_LOSSES, REGULARIZERS) for name in reg.names()
           if key in reg.meta(name)["hparams"].values() or reg.meta(name).get("coef") == key]
  found += [f"transform '{name}'" for name in TRANSFORMS.names()
            if key in TRANSFORMS.meta(name)["reads"]]
  if key in CONDITIONAL:
    found.append(CONDITIONAL[key][1])
  return found


def _differs(name: str, value) -> bool:
  default = KEY_BY_NAME[name].default
  if isinstance(default, (list, tuple)) or isinstance(value, (list, tuple)):
    return tuple(value or ()) != tuple(default or ())
  return value != default


def check_unused(algo: Mapping[str, Any], algorithm, critic=None, reward=None) -> None:
  """Raises ``UnusedKeyError`` for the first key that differs from its default and that
  nothing resolved reads. ``critic`` / ``reward``: those sections, when the caller has them."""
  read = algo_keys_read(algo, algorithm)
  for key, value in algo.items():
    if f"algo.{key}" in KEY_BY_NAME and key not in read and _differs(f"algo.{key}", value):
      used_by = readers(key)
      raise UnusedKeyError(
          f"algo.{key}={value!r} is not used by {_described(algo, algorithm)}"
          + (f"; it is read by {', '.join(used_by)}" if used_by else "")
          + f". Set it back to {KEY_BY_NAME[f'algo.{key}'].default!r} or switch on what reads it")
  if critic is not None and not critic["enabled"]:
    for key in CRITIC_KEYS:
      if _differs(f"critic.{key}", critic[key]):
        raise UnusedKeyError(f"critic.{key}={critic[key]!r} is not used: there is no critic "
                             "(critic.enabled=False)")
  if reward is not None and not reward["overlong_buffer"] and _differs(
      "reward.overlong_penalty", reward["overlong_penalty"]):
    raise UnusedKeyError(f"reward.overlong_penalty={reward['overlong_penalty']!r} is not used: "
                         "the overlong punishment is off (reward.overlong_buffer=0)")


def check_unused_train(train: Mapping[str, Any]) -> None:
  """Raises ``UnusedKeyError`` for a ``TRACKER_KEYS`` key that differs from its default while
  ``train.loggers`` names none of the loggers that read it."""
  for key, loggers in TRACKER_KEYS.items():
    if _differs(f"train.{key}", train[key]) and not set(loggers) & set(train["loggers"]):
      raise UnusedKeyError(
          f"train.{key}={train[key]!r} is not used: it is read by the "
          f"{' and '.join(loggers)} logger{'s' if len(loggers) > 1 else ''}, and train.loggers="
          f"{tuple(train['loggers'])!r} names none; add one or leave the key at its default")


def _described(algo, algorithm) -> str:
  return (f"advantage {algo['advantage']!r}, policy_loss {algo['policy_loss']!r}"
          + "".join(f", transform {t.name!r}" for t in algorithm.transforms))

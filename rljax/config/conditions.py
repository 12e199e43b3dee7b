"""When a key is read: the named conditions of ``Key.read_if`` (``rljax.config.declare``).

A key whose condition is false must keep its default, or the run stops naming it and the reason.
The conditions that look at the reward's composition parse it with ``rljax.config.reward_spec``.
"""
from __future__ import annotations

from rljax.config.declare import (When, above, chosen_reads, component_reads, differs, equals,
                                  registry_meta, registry_names)
from rljax.config.reward_spec import REWARD_MODEL_SOURCE, named_source, reward_weights

COMPONENT = component_reads()
CRITIC = equals("critic.enabled", True, "there is no critic (critic.enabled=False)")
KL_TERM = differs("algo.kl_placement", "none")
DYNAMIC_SAMPLING = equals("algo.dynamic_sampling", True)
SELECTIVE = equals("algo.selective_rollout", True)
OVERLONG_SHAPING = differs("reward.overlong_buffer", 0,
                           "the overlong punishment is off (reward.overlong_buffer=0)")
SINGLE_TURN = equals("env.name", None, lambda f, k: (
    f"env.name={f['env.name']!r} scores the episodes (its steps run under env.timeout_s in the "
    "reward.workers processes)"))
VERIFIER_PROCESSES = above("reward.workers", 0, "reward.workers=0: the verifier runs in the "
                           "trainer's process")
MULTI_TURN = differs("env.name", None, "rollouts are single-turn (env.name=None); set env.name "
                                       "to an environment or drop the key")
LORA = above("model.lora.rank", 0, "model.lora.rank=0 (no adapters)")
SFT_STOP = above("sft.stop_match", 0.0, "sft.stop_match=0 (SFT trains all sft.steps)")
# The SFT cold start is read by a command whose run loads it: its policy (the reward model's start
# under `rljax rm`; the judge 'policy' is the policy) or its distillation teacher.
SFT_MODEL = When(lambda f, k: "sft" in (f["model.source"], f["teacher.source"]),
                 "model.source or teacher.source 'sft'",
                 "no model of the run is the SFT cold start (model.source and teacher.source are "
                 "not 'sft')")
# `rljax train` trains the RLHF demo's reward model first (rljax.train.rlhf) as `rljax rm` does.
GOLD_COLD_START = above("reward.gold.pairs", 0, "the RLHF demo's reward-model cold start is off "
                        "(reward.gold.pairs=0); `rljax rm` reads it")
FRESH_MODEL = When(lambda f, k: f["model.source"] in ("tiny", "sft"),
                   "model.source='tiny' or 'sft'", lambda f, k: (
                       f"model.source={f['model.source']!r} brings its own architecture"))

VISION_MODEL = When(lambda f, k: f.model.vision is not None, "a vision-language policy",
                    lambda f, k: (f"model.source={f['model.source']!r} is a {f.model.model_type} "
                                  "model without an image tower"), frozenset({"model"}))
NO_LORA = equals("model.lora.rank", 0, lambda f, k: (
    f"model.lora.rank={f['model.lora.rank']}: the updates train the adapters only, and the "
    "tower has none (it is part of the frozen base)"))


# Keys that only some pieces of a family read: read when the piece the config picks declares
# them (its registration's ``reads``, rljax.registries), refused naming the pieces that do.
ENGINE_READS = chosen_reads("rollout.engine")
DRIVER_READS = chosen_reads("env.engine")
DATA_SOURCE_READS = chosen_reads("data.source")
LOGGER_READS = chosen_reads("train.loggers")
REWARD_SOURCE_READS = chosen_reads("reward.sources", "reward_source",
                                   lambda text: tuple(reward_weights(text)))
# data.source='NAME:ARGS' names that relations pair with other keys.
REASONING_GYM = "reasoning_gym"
# data.difficulty: read by the embedded tasks, refused only where it would mislead (reasoning-gym's
# generators take their settings from data.reasoning_gym.config), so a preset's difficulty stays
# allowed when a run switches it to a file source.
EMBEDDED_SOURCE = When(lambda f, k: not f["data.source"].startswith(REASONING_GYM + ":"),
                       "a data.source other than reasoning_gym", lambda f, k: (
                           f"data.source={f['data.source']!r} reads its generators' settings "
                           "from data.reasoning_gym.config"))
# A fresh policy of a family with a vision tower (its registration states ``images``): the
# model.vision.* sizes of its tower are read.
# The fresh tower whose sizes are the model.vision.* keys (qwen2_5_vl.tiny_fields); the tiny
# Gemma 3 and Qwen3-VL towers are fixed.
SIZED_TOWER = When(lambda f, k: f["model.family"] == "qwen2_5_vl",
                   "model.family='qwen2_5_vl' (the tiny tower these keys size)", lambda f, k: (
                       f"model.family={f['model.family']!r}: only the tiny Qwen2.5-VL tower is "
                       "sized by model.vision.* keys"))
MOE_MODEL = When(lambda f, k: bool(f.model.moe_layers), "a model with MoE layers",
                 lambda f, k: (f"model.source={f['model.source']!r} is a {f.model.model_type} "
                               "model without MoE layers"), frozenset({"model"}))


def _token_level(meta) -> bool:
  return "token_rewards" in meta["inputs"]


def _one_reward_per_episode(f, k) -> str:
  readers = [n for n in registry_names("advantage") if _token_level(registry_meta("advantage", n))]
  return (f"algo.advantage={f['algo.advantage']!r} reads one reward per episode; the token-level "
          f"estimators read it ({', '.join(readers)})")


def _agg_modes(algorithm) -> set:
  return {algorithm.policy_agg} | {r.agg for r in algorithm.regularizers}

RM_SOURCE = named_source(REWARD_MODEL_SOURCE)
JUDGE_NUMBER = REWARD_SOURCE_READS & equals("reward.judge.parse", "number")

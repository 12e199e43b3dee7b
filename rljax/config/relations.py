"""Constraints between keys: ``RELATIONS``, each a ``Relation`` (``rljax.config.declare``) whose
check returns what is wrong as one line, or None. ``rljax.config.checks`` applies them at start-up.
"""
from __future__ import annotations

from rljax.config.declare import Relation, registry_meta, registry_names
from rljax.config.conditions import FRESH_MODEL, REASONING_GYM, RM_SOURCE
from rljax.config.reward_spec import (ENV_SOURCE, REWARD_MODEL_SOURCE, VERIFIER_SOURCE,
                                      composed_sources, reward_clip, reward_normalize, task_source)
from rljax.config.table import CAPACITY_UNPACKED, CHAR_TOKENIZERS, MESH_AXES


def _one_filled_mesh_axis(f):
  fill = [f"mesh.{axis}" for axis in MESH_AXES if f[f"mesh.{axis}"] == -1]
  if len(fill) > 1:
    return (f"only one mesh axis may be -1 (the devices the others leave), got "
            f"{', '.join(fill)}")


def _context_split(f):
  """What cannot run with each row split over ``mesh.context`` devices (one line)."""
  n = f["mesh.context"]
  if n == 1:
    return None
  split = f"mesh.context={n} splits every row's tokens (and its KV cache) over devices"
  if f["model.attention"] in ("cudnn", "pallas"):
    return (f"{split}; model.attention={f['model.attention']!r}'s kernel returns no log-sum-exp "
            "to combine ring steps: use 'auto' or 'blockwise' (the ring's kernel)")
  if f["rollout.engine"] != "all_rows" or f["env.name"] is not None:
    return (f"{split}; only the all_rows sampler stripes its cache (rollout.engine="
            f"{f['rollout.engine']!r}, env.name={f['env.name']!r}): use all_rows, single-turn")
  if f["model.moe_dispatch"] == "capacity":
    return (f"{split}; model.moe_dispatch='capacity' drops tokens by their order in the "
            "forward, which the split changes: use 'dense' or 'sparse' (dropless)")
  return None


def _multiple(name, of, only_if=lambda f: True):
  def broken(f):
    if only_if(f) and f[name] % f[of]:
      return f"{name}={f[name]} must be a multiple of {of}={f[of]}"
  return broken


def _rows_split(f):
  rows = f["rollout.prompts_per_step"] * f["rollout.group_size"]
  if rows % (f["algo.minibatches"] * f["algo.micro_batches"]):
    return (f"rollout.prompts_per_step x rollout.group_size = {rows} rows do not split into "
            f"algo.minibatches={f['algo.minibatches']} x "
            f"algo.micro_batches={f['algo.micro_batches']} equal parts")


def _teacher(f):
  if f["algo.opd_coef"] > 0 and not f["teacher.source"]:
    return (f"algo.opd_coef={f['algo.opd_coef']!r} needs a distillation teacher: set "
            "teacher.source ('hf:PATH', 'run:DIR', 'sft' or 'tiny')")


def _lora_critic(f):
  if f["model.lora.rank"] > 0 and f["critic.enabled"]:
    return (f"model.lora.rank={f['model.lora.rank']} with critic.enabled=True: the critic is a "
            "full trainable copy of the policy's trunk and shares nothing with the frozen base; "
            "use a critic-free estimator (critic.enabled=False) or model.lora.rank=0")


def _lora_reference(f):
  if f["model.lora.rank"] > 0 and f["algo.ref_update"] == "ema" and f["algo.kl_placement"] != "none":
    return (f"model.lora.rank={f['model.lora.rank']} with algo.ref_update='ema': the reference "
            "of a LoRA policy is its frozen base (no second copy to average into); use "
            "algo.ref_update='frozen' or model.lora.rank=0")


def _selective_groups(f):
  if f["algo.selective_rollout"] and f["rollout.group_size"] == 1:
    return ("algo.selective_rollout=True with rollout.group_size=1: a group of one completion "
            "never has a reward spread, so every prompt would count as uninformative; use "
            "rollout.group_size >= 2")


def _needs_groups(f):
  """An estimator that reads ``group_size`` and declares no smaller minimum (``min_group_size``)
  has its baseline from the other completions of the prompt."""
  advantage = f["algo.advantage"]
  meta = registry_meta("advantage", advantage)
  if (f["rollout.group_size"] == 1 and "group_size" in meta["inputs"]
      and meta.get("min_group_size", 2) > 1):
    return (f"rollout.group_size=1 with algo.advantage={advantage!r}"
            + (f" (adv_std={f['algo.adv_std']!r})" if advantage == "grpo" else "")
            + ": this estimator's baseline comes from the other completions of the prompt; "
            "use rollout.group_size >= 2")


def _inflight_single_turn(f):
  chunk = f["rollout.inflight_chunk"]
  if chunk and f["env.name"] is not None:
    return (f"rollout.inflight_chunk={chunk}: multi-turn episodes (env.name={f['env.name']!r}) "
            "take new weights between steps only")
  if chunk and f["model.router_replay"] == "R3":
    return (f"rollout.inflight_chunk={chunk} with model.router_replay='R3': the sampler's "
            "experts are not joined across chunks; use 'R2' or 'off'")


def _replay_single_turn(f):
  if f["model.router_replay"] == "R3" and f["env.name"] is not None:
    return ("model.router_replay='R3' replays the experts the sampler chose for each token; "
            f"multi-turn episodes (env.name={f['env.name']!r}) do not record them: use 'R2' (the "
            "old-log-prob forward's experts) or 'off'")


def _hermes_tokenizer(f):
  if f["env.name"] is not None and f["env.tool_format"] == "hermes" \
      and f["data.tokenizer"] in CHAR_TOKENIZERS:
    return ("env.tool_format='hermes' needs a tokenizer that can write "
            "'<tool_call>{\"name\": ...}</tool_call>'; the char tokenizer has no braces, quotes or "
            "'_': use env.tool_format='compact'")


def _overlong_buffer(f):
  if f["env.name"] is None and f["reward.overlong_buffer"] > f["rollout.max_new_tokens"]:
    return (f"reward.overlong_buffer={f['reward.overlong_buffer']} is larger than "
            f"rollout.max_new_tokens={f['rollout.max_new_tokens']}: the punishment would start "
            "before the first token; use a buffer of at most the completion budget")


def _sft_warmup(f):
  if f["sft.warmup_steps"] > f["sft.steps"]:
    return (f"sft.warmup_steps={f['sft.warmup_steps']} is more than sft.steps={f['sft.steps']}: "
            "the cold start would end before its learning rate reaches sft.lr; set "
            f"sft.warmup_steps <= {f['sft.steps']}")


def _gym_reward(f):
  if f["reward.fn"] == REASONING_GYM and f["data.source"].partition(":")[0] != REASONING_GYM:
    return (f"reward.fn={REASONING_GYM!r} scores problems of data.source='{REASONING_GYM}:NAME' "
            f"only (it calls the generating task's scorer); data.source={f['data.source']!r}")


def _images_taken(f):
  """An embedded task whose problems are images (its registration states ``images``) needs a
  policy that takes images (a family with a tower: the 'tiny' / 'sft' policy's ``model.family``;
  a checkpoint's is checked when loaded) and rollouts that take them: the all_rows engine,
  single-turn, not in flight. Sources of files are checked when read
  (``rljax.data.datasets.make_prompt_source``)."""
  name, _, task = f["data.source"].partition(":")
  if name != "embedded" or task not in registry_names("task"):
    return None
  if not registry_meta("task", task)["images"]:
    return None
  shown = f"data.source={f['data.source']!r} poses its problems as images"
  family = f["model.family"]
  if f["model.source"] in ("tiny", "sft") and family in registry_names("model_family") \
      and not registry_meta("model_family", family)["images"]:
    unwired = [n for n in registry_names("model_family")
               if registry_meta("model_family", n)["tower"]
               and not registry_meta("model_family", n)["images"]]
    wired = ", ".join(repr(n) for n in registry_names("model_family")
                      if registry_meta("model_family", n)["images"])
    why = "a text-only family" + (f", or one whose image prompts runs do not encode yet: "
                                  f"{', '.join(unwired)}" if unwired else "")
    return (f"{shown}; model.family={family!r} takes no images in a run ({why}): use "
            f"model.family in ({wired}) with data.tokenizer='char_vl'")
  if f["rollout.engine"] != "all_rows" or f["env.name"] is not None \
      or f["rollout.inflight_chunk"]:
    return (f"{shown}; only single-turn all_rows rollouts, not in flight, take images "
            f"(rollout.engine={f['rollout.engine']!r}, env.name={f['env.name']!r}, "
            f"rollout.inflight_chunk={f['rollout.inflight_chunk']})")


def _normalized_sources(f):
  names = composed_sources(f)
  for key, parse in (("reward.normalize", reward_normalize), ("reward.clip", reward_clip)):
    stray = [n for n in parse(f[key]) if n not in names]
    if stray:
      return (f"{key}={f[key]!r} names {stray[0]!r}, which is not a source of the reward "
              f"(reward.sources={f['reward.sources']!r}: {', '.join(names)})")


def _task_source_fits(f):
  names, own = composed_sources(f), task_source(f)
  other = ENV_SOURCE if own == VERIFIER_SOURCE else VERIFIER_SOURCE
  if other in names:
    why = (f"single-turn rollouts (env.name=None) are scored by '{VERIFIER_SOURCE}'"
           if own == VERIFIER_SOURCE else
           f"multi-turn episodes (env.name={f['env.name']!r}) are scored by '{ENV_SOURCE}'")
    return f"reward.sources={f['reward.sources']!r} names '{other}': {why}"


def _turn_rewards_alone(f):
  """Per-turn token rewards (turn_discount < 1) carry the environment's reward only."""
  if f["env.name"] is None or f["env.turn_discount"] >= 1.0:
    return None
  names = composed_sources(f)
  added = [n for n, w in names.items() if w and n != ENV_SOURCE]
  if names.get(ENV_SOURCE) != 1.0 or added or ENV_SOURCE in reward_normalize(
      f["reward.normalize"]) or ENV_SOURCE in reward_clip(f["reward.clip"]):
    return (f"env.turn_discount={f['env.turn_discount']} places the environment's own turn "
            f"rewards on tokens; reward.sources={f['reward.sources']!r} (with reward.normalize/"
            "clip) changes the episode's reward: use 'env:1.0' unnormalised (other sources with "
            "weight 0, logged only) or env.turn_discount=1")


def _sampler_old_logp(f):
  """``algo.old_logp='sampler'`` leaves out the scoring forward, so nothing may need it: the
  80/20 mask's ``H_old``, R2's replayed experts; rollout correction sampler -> old would weigh
  every token by ``exp(0) = 1``."""
  if f["algo.old_logp"] != "sampler":
    return None
  why = "algo.old_logp='sampler' runs no scoring forward"
  if f["algo.entropy_top_rho"] < 1.0:
    return (f"algo.entropy_top_rho={f['algo.entropy_top_rho']!r} masks by H_old of the scoring "
            f"forward; {why}: use algo.old_logp='recompute'")
  if f["model.router_replay"] == "R2":
    return (f"model.router_replay='R2' replays the experts of the old-log-prob forward; {why}: "
            "use 'R3' (the sampler's experts) or 'off'")
  correcting = [f"{k}={f[k]!r}" for k, off in CORRECTION_OFF.items() if f[k] != off]
  if correcting:
    return (f"{correcting[0]}: rollout correction weighs sampler -> old log-probs, and with "
            "algo.old_logp='sampler' they are the same (every ratio 1); drop it, or use "
            "algo.old_logp='recompute'")


# The rollout-correction keys and their 'off' values (rljax.transforms.correction).
CORRECTION_OFF = {"algo.tis_cap": None, "algo.rollout_is": "none", "algo.rollout_rs": "none",
                  "algo.rollout_rs_veto": None, "algo.rollout_rs_k3": None}


def _reward_model_named(f):
  if RM_SOURCE.test(f, "") and not f["reward.model.source"]:
    return (f"reward.sources={f['reward.sources']!r} names '{REWARD_MODEL_SOURCE}': set "
            "reward.model.source ('hf:PATH' of a sequence classifier or 'run:DIR' of an "
            "`rljax rm` run)")


def _env_workers(f):
  if f["env.name"] is not None and f["reward.workers"] == 0:
    return (f"reward.workers=0 with env.name={f['env.name']!r}: the environment's steps run in "
            "worker processes (under env.timeout_s); set reward.workers >= 1")


def _capacity_unpacked(f):
  if f["model.moe_dispatch"] == "capacity" and str(f["model.pack"]).lower() == "true":
    return CAPACITY_UNPACKED


def _speculative(f):
  """What speculative decoding (``rollout.draft``) is not built for, one line each."""
  draft = f["rollout.draft"]
  if draft == "none":
    return None
  what = f"rollout.draft={draft!r}"
  if f["env.name"] is not None and f["env.engine"] != "turn_sync":
    return (f"{what}: env.engine={f['env.engine']!r} decodes multi-turn episodes in its own loop "
            "(rljax.rollout.turns' lanes), which drafts nothing; use env.engine='turn_sync' "
            "(each turn one speculative rollout.engine call) or rollout.draft='none'")
  if f["mesh.context"] > 1:
    return (f"{what} verifies each row against its whole KV cache on one device; "
            f"mesh.context={f['mesh.context']} stripes it: set rollout.draft='none' or "
            "mesh.context=1")
  if f["model.router_replay"] == "R3":
    return (f"{what} with model.router_replay='R3': the verification forward records no "
            "experts per token; use 'R2' (the old-log-prob forward's experts) or 'off'")


RELATIONS = (
    Relation(("reward.normalize", "reward.clip", "reward.sources"),
             "per-source normalisation names sources of the reward", _normalized_sources),
    Relation(("reward.sources", "env.name"),
             "'verifier' scores single-turn rollouts, 'env' multi-turn episodes",
             _task_source_fits),
    Relation(("reward.workers", "env.name"), "an environment steps in worker processes",
             _env_workers),
    Relation(("reward.sources", "env.turn_discount"),
             "per-turn token rewards: the environment's reward alone", _turn_rewards_alone),
    Relation(tuple(f"mesh.{axis}" for axis in MESH_AXES), "at most one axis is -1",
             _one_filled_mesh_axis),
    Relation(("mesh.context", "model.attention", "rollout.engine", "env.name",
              "model.moe_dispatch"),
             "sequences split over mesh.context: the ring's kernel, the all_rows sampler, "
             "dropless experts", _context_split),
    Relation(("model.hidden_size", "model.num_heads"), "heads divide the width ('tiny'/'sft')",
             _multiple("model.hidden_size", "model.num_heads", lambda f: FRESH_MODEL.test(f, ""))),
    Relation(("model.num_heads", "model.num_kv_heads"),
             "key/value heads divide the query heads ('tiny'/'sft')",
             _multiple("model.num_heads", "model.num_kv_heads", lambda f: FRESH_MODEL.test(f, ""))),
    Relation(("rollout.prompts_per_step", "rollout.group_size", "algo.minibatches",
              "algo.micro_batches"), "the P x G rows of a step split into minibatches x "
             "micro_batches equal parts", _rows_split),
    Relation(("algo.opd_coef", "teacher.source"), "distillation (opd_coef > 0) needs a teacher",
             _teacher),
    Relation(("rollout.group_size", "algo.advantage"),
             "G >= 2 for an estimator whose baseline is the group", _needs_groups),
    Relation(("algo.selective_rollout", "rollout.group_size"),
             "selective rollouts judge a prompt by its group's spread: G >= 2", _selective_groups),
    Relation(("rollout.inflight_chunk", "env.name", "model.router_replay"),
             "in-flight updates: single-turn rollouts, router replay not R3",
             _inflight_single_turn),
    Relation(("model.router_replay", "env.name"), "R3 replay: single-turn rollouts",
             _replay_single_turn),
    Relation(("rollout.draft", "env.name", "env.engine", "mesh.context",
              "model.router_replay"),
             "speculative decoding: turn-synchronous episodes, each row's cache on one device, "
             "no R3 replay",
             _speculative),
    Relation(("env.tool_format", "data.tokenizer"), "hermes tool calls need a real tokenizer",
             _hermes_tokenizer),
    Relation(("reward.overlong_buffer", "rollout.max_new_tokens"),
             "DAPO's overlong buffer is at most the completion budget", _overlong_buffer),
    Relation(("sft.warmup_steps", "sft.steps"), "the SFT warmup ends within its steps",
             _sft_warmup),
    Relation(("reward.fn", "data.source"), "the reasoning_gym scorer needs its source",
             _gym_reward),
    Relation(("data.source", "model.family", "rollout.engine", "env.name",
              "rollout.inflight_chunk"),
             "a task of images needs a vision-language policy and single-turn all_rows rollouts",
             _images_taken),
    Relation(("reward.sources", "reward.model.source"),
             f"the reward model source '{REWARD_MODEL_SOURCE}' needs reward.model.source",
             _reward_model_named),
    Relation(("model.pack", "model.moe_dispatch"),
             "capacity dispatch is never packed (it is not layout-invariant)", _capacity_unpacked),
    Relation(("model.lora.rank", "critic.enabled"),
             "LoRA: no critic (it would be a full copy sharing nothing with the base)",
             _lora_critic),
    Relation(("model.lora.rank", "algo.ref_update", "algo.kl_placement"),
             "LoRA: the reference is the frozen base (algo.ref_update='frozen')", _lora_reference),
    Relation(("algo.old_logp", "algo.entropy_top_rho", "model.router_replay", *CORRECTION_OFF),
             "algo.old_logp='sampler': no 80/20 mask, R2 replay or rollout correction (each "
             "needs the scoring forward or compares the sampler with itself)", _sampler_old_logp),
)

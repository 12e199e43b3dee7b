"""The registered components and ``docs/algorithms.md``, the reference generated from them.

Every registry (advantage estimators, policy objectives, loss aggregations, KL estimators,
regularisers, transforms, reward functions, environments, tools) contributes each name it holds:
the function's signature and module, the config keys its registration binds (with their declared
defaults) and its docstring, which carries the formula and the paper. The few pieces that are
plain functions rather than registered names (reward shaping, whitening, the value loss, the
batch filter, the functions a transform computes) are listed here by section. ``rljax components``
prints the registered names; ``python -m rljax components --markdown > docs/algorithms.md``
writes the reference (a test keeps the file in step).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rljax import envs
from rljax.envs import drivers as _env_engines  # noqa: F401 (registers the 'env' reward source)
from rljax.algos import (advantages, correction, cov, distill, entropy, kl, registry, value)
from rljax.config.table import KEY_BY_NAME
from rljax.rewards import gold as _gold  # noqa: F401 (registers the 'gold' reward source)
from rljax.rewards import judge as _judge  # noqa: F401 (registers the 'judge' reward source)
from rljax.rewards import reward_model as _rm  # noqa: F401 (registers the 'rm' reward source)
from rljax.rewards import shaping, sources, checkers
from rljax.train import filters, selective
from rljax.transforms import TRANSFORMS


def families() -> Dict[str, List[str]]:
  """``{family: registered names}``: what ``rljax components`` lists."""
  table = dict(registry.list_registries())
  table["transform"] = sorted(TRANSFORMS.names(), key=lambda n: TRANSFORMS.meta(n)["order"])
  table["reward_fn"] = checkers.REWARD_FNS.names()
  table["reward_source"] = sources.REWARD_SOURCES.names()  # reward.sources
  table["env"], table["tool"] = envs.env_names(), envs.tool_names()  # env.name; tools of envs
  return table


# --- the sections ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Section:
  title: str
  intro: str
  family: str = ""  # a family of ``families()`` whose every name gets an entry
  functions: Tuple[Callable, ...] = ()  # plain functions documented after the registered names


# The functions a transform computes (its factory's docstring says when and why it is on).
TRANSFORM_FUNCTIONS: Dict[str, Tuple[Callable, ...]] = {
    "kl_coef": (kl.adaptive_kl_coef,),
    "entropy_ctrl": (entropy.entropy_ctrl_step, entropy.sampled_entropy),
    "rollout_correction": (correction.rollout_rejection_mask, correction.rollout_is_weights,
                           correction.mismatch_metrics),
    "opd": (distill.opd_advantages, distill.add_opd_advantages),
    "cov_selection": (cov.token_covariance, cov.clip_cov_select, cov.kl_cov_select),
    "entropy_mask": (entropy.entropy_keep_mask,),
}

NOTATION = """\
- A rollout batch holds `B = P * G` rows: `P` prompts with `G` completions each, groups
  contiguous (rows `p*G .. p*G+G-1` share a prompt); group estimators reshape to `[P, G]`.
- Completion tokens are `[B, T]`, `T = rollout.max_new_tokens`, with the mask `m[i,t]` (1 on the
  completion's tokens, its EOS included; 0 on padding). `|o_i| = sum_t m[i,t]`.
- `logp`: log-prob of a sampled token under the policy being trained; `old_logp`: under the
  weights the update starts from (recomputed by the trainer), or with `algo.old_logp='sampler'`
  `sampler_logp`; `ref_logp`: under the reference; `sampler_logp`: what the sampler reported.
- `R_i`: the outcome reward of completion i after shaping. `delta = logp - old_logp`, clamped to
  `[-20, 20]` before any `exp`; `r = exp(delta)`. `sg(x)`: stop-gradient. `sigma`: the sigmoid.
- Per-token losses `l[i,t]` are minimised. Every loss is a `(sum, count)` pair over the whole
  minibatch (all micro-batches and devices), divided once, so the split never changes a result.
- "Zero the loss": `l[i,t] <- 0` with `m` unchanged (the token still counts in every
  denominator). "Reject": `m[i,t] <- 0` (or the whole row), applied after the advantages:
  rejected entries leave every count."""

SECTIONS: Tuple[Section, ...] = (
    Section("1. Rewards and shaping",
            "The verifier (`reward.fn`) scores each completion; shaping adds terms counted in "
            "tokens, never characters. `reward.format_weight` adds a format term "
            "(`format_ok`); `reward.wrong_value` is the reward of a wrong answer.",
            family="reward_fn",
            functions=(checkers.format_ok, shaping.overlong_penalty,
                       shaping.overlong_filter_mask, kl.kl_reward_penalty, kl.kl_reward_tokens)),
    Section("1.1 Reward sources (`reward.sources`)",
            "The reward is a weighted sum of named sources (docs/reward_models.md), each "
            "normalised as `reward.normalize` / `reward.clip` declare and logged raw as "
            "`reward/<name>`; the shaping above applies to the sum.",
            family="reward_source", functions=(sources.whiten, sources.normalize)),
    Section("2. Advantage estimators (`algo.advantage`)",
            "Outcome estimators compute a row advantage `A_i` and broadcast it, `A[i,t] = A_i "
            "m[i,t]`; every estimator is exactly 0 on padding. Group estimators need `G >= 2` "
            "(a config error otherwise) and give `A = 0`, never NaN, to a group with no reward "
            "spread.",
            family="advantage", functions=(advantages.whiten,)),
    Section("3. Policy objectives (`algo.policy_loss`)",
            "Each objective returns per-token losses `[B, T]` (or one per sequence) and "
            "`(sum, count)` metrics. Every objective logs its clip fractions (low and high "
            "apart), the mean ratio and the approximate KL `mean(-delta)`.",
            family="policy_loss"),
    Section("4. Loss aggregation (`algo.loss_agg`)",
            "Over the whole minibatch, across micro-batches and devices: each part returns "
            "`(sum, count)` and the division happens once. Rows with no valid token are left "
            "out of sequence means. An objective may force its aggregation.",
            family="loss_agg"),
    Section("5. Regularisers (`algo.<name>_coef`)",
            "Terms `coef * agg(values)` added to the policy loss, each on while its coefficient "
            "is non-zero (or a transform drives it). The KL term compares the policy with the "
            "reference through a KL estimator (`algo.kl_estimator`); `algo.kl_placement` puts "
            "it in the loss, in the reward (section 1) or nowhere (no reference model is "
            "loaded).",
            family="regularizer", functions=(kl.ema_update,)),
    Section("5.1 KL estimators (`algo.kl_estimator`)",
            "Elementwise `k(logp, ref_logp)` on the sampled tokens; what matters in the loss is "
            "the gradient with respect to `logp`.",
            family="kl_estimator"),
    Section("6. Value model (`critic.*`)",
            "With `critic.enabled`: the policy's trunk with a scalar head, its own optimizer "
            "(`critic.lr`), trained on the targets of the `gae` estimator; "
            "`critic.pretrain_steps` updates of the critic alone (VC-PPO, VAPO) before the first "
            "policy update.",
            functions=(value.value_loss_sum, value.explained_variance)),
    Section("7. Batch construction",
            "`rollout.group_size` completions per prompt. Dynamic sampling "
            "(`algo.dynamic_sampling`) samples further rounds of prompts until `P` groups pass "
            "the filter below (at most `algo.max_gen_batches` rounds; then it trains on what "
            "was kept and logs it). Selective rollouts (`algo.selective_rollout`, GRESO) skip a "
            "drawn prompt before it is sampled by its run of groups with no spread "
            "(`rljax.train.selective`), with or without dynamic sampling. `algo.epochs` passes "
            "over the batch in `algo.minibatches` optimizer steps, each accumulated over "
            "`algo.micro_batches`.",
            functions=(filters.group_keep_mask, selective.skip_probability,
                       selective.adapt_exploration)),
    Section("8. Transforms",
            "Pieces with state or hooks (`rljax.transforms.base`): controllers, corrections of "
            "the batch, token selections, extra rollouts, host checks, a frozen second model. "
            "Listed in hook order; each is on when its keys say so, and lists the keys it reads.",
            family="transform"),
    Section("9. Environments and tools (`env.name`)",
            "Multi-turn environments (docs/multiturn.md) and the tools their episodes may call.",
            family="env"),
)


# --- rendering ------------------------------------------------------------------------------------

def heading(family: str, name: str) -> str:
  """The heading of a registered component (its anchor: ``#<family>-<name>``, punctuation
  dropped, e.g. ``algorithms.md#transform-rollout_correction``)."""
  return f"### {family} `{name}`"


def _md(text: Optional[str]) -> str:
  """A docstring as Markdown: RST literals become code spans."""
  return (text or "(no docstring)").replace("``", "`").strip()


def _signature(fn: Callable) -> str:
  params, star = [], False
  for p in inspect.signature(fn).parameters.values():
    if p.kind == p.KEYWORD_ONLY and not star:
      params.append("*")
      star = True
    params.append(p.name)
  return f"{fn.__name__}({', '.join(params)})"


def _where(fn: Callable) -> str:
  return f"`{_signature(fn)}` in `{fn.__module__}`"


def _key(name: str) -> str:
  """A config key with its declared default (``config.md`` has the rest)."""
  declared = KEY_BY_NAME.get(name)
  return f"`{name}`" if declared is None else f"`{name}` (default `{declared.default!r}`)"


def _bound_keys(meta: Dict[str, Any]) -> List[str]:
  """The keys a registration binds to its keyword-only parameters (or their fixed defaults)."""
  out = []
  for keyword, key in meta.get("hparams", {}).items():
    name = f"algo.{key}"
    if name in KEY_BY_NAME:
      out.append(_key(name))
    else:
      out.append(f"`{keyword}` = `{meta['defaults'].get(keyword)!r}` (no config key)")
  return out


def _registration_facts(family: str, meta: Dict[str, Any]) -> List[str]:
  """What a registration's meta says, in words (callables are conditions: named, not shown)."""
  facts = []
  if meta.get("loss_agg"):
    facts.append(f"forces `algo.loss_agg='{meta['loss_agg']}'`")
  if meta.get("per_sequence"):
    facts.append("one loss per sequence: only for objectives that force it")
  if meta.get("whitened"):
    facts.append("whitened by definition (`algo.adv_whiten` is not read)")
  if meta.get("critic_targets"):
    facts.append("also returns the critic's targets (needs `critic.enabled`)")
  if "min_group_size" in meta:
    facts.append(f"allows `G >= {meta['min_group_size']}`")
  if family == "regularizer":
    agg = meta["agg"]
    facts.append("aggregated like the policy loss" if agg == "policy" else
                 f"aggregated with `{agg}`" if isinstance(agg, str) else
                 "aggregation set by the config (see below)")
    if meta.get("token_mask") is not None:
      facts.append(f"over the tokens of `{meta['token_mask'].__name__}`")
  return facts


def _registered_entry(family: str, name: str) -> List[str]:
  reg = registry.get_family(family)
  fn, meta = reg.get(name), reg.meta(name)
  keys = ([_key(f"algo.{meta['coef']}")] if family == "regularizer" else []) + _bound_keys(meta)
  lines = [heading(family, name), "", _where(fn) + "  "]
  if keys:
    lines.append("Keys: " + ", ".join(keys) + "  ")
  facts = _registration_facts(family, meta)
  if facts:
    lines.append("Registration: " + "; ".join(facts) + "  ")
  return lines + ["", _md(inspect.getdoc(fn)), ""]


def _transform_entry(name: str) -> List[str]:
  factory, meta = TRANSFORMS.get(name), TRANSFORMS.meta(name)
  lines = [heading("transform", name), "",
           f"`{factory.__module__}.{factory.__name__}`, hook order {meta['order']}  "]
  if meta["reads"]:
    lines.append("Keys: " + ", ".join(_key(f"algo.{k}") for k in meta["reads"]) + "  ")
  lines += ["", _md(inspect.getdoc(factory)), ""]
  for fn in TRANSFORM_FUNCTIONS.get(name, ()):
    lines += [f"#### `{fn.__name__}`", "", _where(fn), "", _md(inspect.getdoc(fn)), ""]
  return lines


def _reward_entry(name: str) -> List[str]:
  fn, spec = checkers.REWARD_FNS[name], checkers.REWARD_SPECS[name]
  output = "binary (0 or 1)" if spec.binary else f"a real in [{spec.low}, {spec.high}]"
  return [heading("reward_fn", name), "", _where(fn) + "  ", f"Returns: {output}", "",
          _md(inspect.getdoc(fn)), ""]


def _env_entries() -> List[str]:
  lines = []
  for name in envs.env_names():
    cls = envs.get_env_class(name)
    lines += [heading("env", name), "", f"`{cls.__module__}.{cls.__name__}`", "",
              _md(inspect.getdoc(cls)), ""]
  for name in envs.tool_names():
    tool = envs.TOOLS[name]
    lines += [heading("tool", name), "", _where(tool.fn), "", _md(tool.description), ""]
  return lines


def _function_entry(fn: Callable) -> List[str]:
  return [f"### `{fn.__name__}`", "", _where(fn), "", _md(inspect.getdoc(fn)), ""]


def _anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
  kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
  return kept.replace(" ", "-")


def _entries(section: Section) -> List[str]:
  lines = []
  if section.family == "reward_fn":
    for name in checkers.REWARD_FNS.names():
      lines += _reward_entry(name)
  elif section.family == "reward_source":
    for name in sources.REWARD_SOURCES.names():
      factory = sources.REWARD_SOURCES.get(name)
      lines += [heading("reward_source", name), "", _where(factory), "",
                _md(inspect.getdoc(factory)), ""]
  elif section.family == "transform":
    for name in families()["transform"]:
      lines += _transform_entry(name)
  elif section.family == "env":
    lines += _env_entries()
  elif section.family:
    for name in registry.get_family(section.family).names():
      lines += _registered_entry(section.family, name)
  for fn in section.functions:
    lines += _function_entry(fn)
  return lines


def markdown(sections: Sequence[Section] = SECTIONS) -> str:
  """``docs/algorithms.md``."""
  table = families()
  lines = ["# Algorithm components", "",
           "Generated from the registered components (their registrations and docstrings) by "
           "`python -m rljax components --markdown`; do not edit. An algorithm is a "
           "configuration that picks one name per family (`configs/algos/<algo>.py`); every key, "
           "its range and meaning: [config.md](config.md). A config file or a notebook can register "
           "more components; `rljax components` lists what is registered.", "",
           "## Contents", ""]
  lines += [f"- [{s.title}](#{_anchor(s.title)})" for s in sections]
  lines += ["", "Registered names: " + "; ".join(
      f"{family} {', '.join(f'`{n}`' for n in names)}" for family, names in table.items()), "",
      "## Notation", "", NOTATION, ""]
  for section in sections:
    lines += [f"## {section.title}", "", section.intro, ""] + _entries(section)
  return "\n".join(lines).rstrip("\n") + "\n"

"""The registered components and ``docs/algorithms.md``, the reference generated from them.

Every registry of ``rljax.registries`` (advantage estimators, policy objectives, loss
aggregations, KL estimators, regularisers, transforms, reward functions and sources, rollout and
episode engines, environments, tools, data sources, embedded tasks, model families, loggers)
contributes each name it holds: the function's signature and module, the config keys its
registration binds or reads (with their declared defaults) and its docstring, which carries the
formula and the paper. The few pieces that are
plain functions rather than registered names (reward shaping, whitening, the value loss, the
batch filter, the functions a transform computes) are listed here by section. ``rljax components``
prints the registered names; ``python -m rljax components --markdown > docs/algorithms.md``
writes the reference (a test keeps the file in step).
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rljax import registries
from rljax.algos import (advantages, correction, cov, distill, entropy, kl, value)
from rljax.config.table import KEY_BY_NAME
from rljax.rewards import shaping, sources, checkers
from rljax.train import filters, selective
from rljax.registries import TRANSFORMS

ALGORITHM_FAMILIES = ("advantage", "policy_loss", "loss_agg", "kl_estimator", "regularizer")


def families() -> Dict[str, List[str]]:
  """``{family: registered names}`` of every registry (transforms in hook order): what
  ``rljax components`` lists."""
  table = {kind: reg.names() for kind, reg in registries.FAMILIES.items()}
  table["transform"] = sorted(TRANSFORMS.names(), key=lambda n: TRANSFORMS.meta(n)["order"])
  return table


# --- the sections ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Section:
  title: str
  intro: str
  families: Tuple[str, ...] = ()  # families of ``families()`` whose every name gets an entry
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
            families=("reward_fn",),
            functions=(checkers.format_ok, shaping.overlong_penalty,
                       shaping.overlong_filter_mask, kl.kl_reward_penalty, kl.kl_reward_tokens)),
    Section("1.1 Reward sources (`reward.sources`)",
            "The reward is a weighted sum of named sources (docs/reward_models.md), each "
            "normalised as `reward.normalize` / `reward.clip` declare and logged raw as "
            "`reward/<name>`; the shaping above applies to the sum.",
            families=("reward_source",), functions=(sources.whiten, sources.normalize)),
    Section("2. Advantage estimators (`algo.advantage`)",
            "Outcome estimators compute a row advantage `A_i` and broadcast it, `A[i,t] = A_i "
            "m[i,t]`; every estimator is exactly 0 on padding. Group estimators need `G >= 2` "
            "(a config error otherwise) and give `A = 0`, never NaN, to a group with no reward "
            "spread.",
            families=("advantage",), functions=(advantages.whiten,)),
    Section("3. Policy objectives (`algo.policy_loss`)",
            "Each objective returns per-token losses `[B, T]` (or one per sequence) and "
            "`(sum, count)` metrics. Every objective logs its clip fractions (low and high "
            "apart), the mean ratio and the approximate KL `mean(-delta)`.",
            families=("policy_loss",)),
    Section("4. Loss aggregation (`algo.loss_agg`)",
            "Over the whole minibatch, across micro-batches and devices: each part returns "
            "`(sum, count)` and the division happens once. Rows with no valid token are left "
            "out of sequence means. An objective may force its aggregation.",
            families=("loss_agg",)),
    Section("5. Regularisers (`algo.<name>_coef`)",
            "Terms `coef * agg(values)` added to the policy loss, each on while its coefficient "
            "is non-zero (or a transform drives it). The KL term compares the policy with the "
            "reference through a KL estimator (`algo.kl_estimator`); `algo.kl_placement` puts "
            "it in the loss, in the reward (section 1) or nowhere (no reference model is "
            "loaded).",
            families=("regularizer",), functions=(kl.ema_update,)),
    Section("5.1 KL estimators (`algo.kl_estimator`)",
            "Elementwise `k(logp, ref_logp)` on the sampled tokens; what matters in the loss is "
            "the gradient with respect to `logp`.",
            families=("kl_estimator",)),
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
            families=("transform",)),
    Section("9. Environments and tools (`env.name`)",
            "Multi-turn environments (docs/multiturn.md) and the tools their episodes may call.",
            families=("environment", "tool")),
    Section("10. Engines (`rollout.engine`, `env.engine`)",
            "A rollout engine samples completions of prompts (`rljax.rollout.engines`, "
            "docs/rollout.md); an episode engine is a multi-turn driver that wraps the run's "
            "rollout engine and plays whole episodes against the environment "
            "(`rljax.envs.drivers`). Keys an engine lists are read only when it is picked.",
            families=("rollout_engine", "episode_engine")),
    Section("11. Data sources (`data.source`)",
            "`data.source='NAME:ARGS'` names a registered data source (`rljax.data.sources`: "
            "how to write one) and its argument; `embedded:NAME` names an embedded task. Keys a "
            "source lists are read only when it is picked.",
            families=("data_source", "task")),
    Section("12. Model families (`model.family`)",
            "Per Hugging Face `model_type`, the blocks that differ (`rljax.models.families`); "
            "`model.family` picks one for a fresh `tiny` model, a checkpoint's config.json "
            "names its own.",
            families=("model_family",)),
    Section("13. Loggers (`train.loggers`)",
            "Where metrics go besides the run's own `metrics.jsonl` (`rljax.runs.trackers`, "
            "docs/integrations.md). Keys a logger lists are read only when it is named.",
            families=("logger",)),
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
  reg = registries.family(family)
  fn, meta = reg.get(name), reg.meta(name)
  keys = ([_key(f"algo.{meta['coef']}")] if family == "regularizer" else []) + _bound_keys(meta)
  lines = [heading(family, name), "", _where(fn) + "  "]
  if keys:
    lines.append("Keys: " + ", ".join(keys) + "  ")
  facts = _registration_facts(family, meta)
  if facts:
    lines.append("Registration: " + "; ".join(facts) + "  ")
  return lines + ["", _md(inspect.getdoc(fn)), ""]


def _documented(family: str, piece: Any) -> Tuple[str, Optional[str]]:
  """``(where, docstring)`` of a registered piece: a function or class is its own document; a
  record is documented by what it holds (a tool by its function, a model family by its
  module)."""
  if family == "tool":
    return _where(piece.fn), piece.description
  if family == "model_family":
    module = sys.modules[piece.config_from_hf.__module__]
    return f"`{module.__name__}` (family `{piece.name}`)", inspect.getdoc(module)
  if inspect.isclass(piece):
    return f"`{piece.__module__}.{piece.__name__}`", inspect.getdoc(piece)
  return _where(piece), inspect.getdoc(piece)


def _piece_entry(family: str, name: str) -> List[str]:
  """A registered piece that is not an algorithm component: where, the keys only it reads (its
  registration's ``reads``), its docstring."""
  reg = registries.family(family)
  where, doc = _documented(family, reg.get(name))
  lines = [heading(family, name), "", where + "  "]
  reads = reg.meta(name)["reads"]
  if reads:
    lines.append("Keys: " + ", ".join(_key(k) for k in reads) + "  ")
  return lines + ["", _md(doc), ""]


def _transform_entry(name: str) -> List[str]:
  factory, meta = TRANSFORMS.get(name), TRANSFORMS.meta(name)
  lines = [heading("transform", name), "",
           f"`{factory.__module__}.{factory.__name__}`, hook order {meta['order']}  "]
  if meta["reads"]:
    lines.append("Keys: " + ", ".join(_key(k) for k in meta["reads"]) + "  ")
  lines += ["", _md(inspect.getdoc(factory)), ""]
  for fn in TRANSFORM_FUNCTIONS.get(name, ()):
    lines += [f"#### `{fn.__name__}`", "", _where(fn), "", _md(inspect.getdoc(fn)), ""]
  return lines


def _reward_entry(name: str) -> List[str]:
  fn, spec = checkers.REWARD_FNS.get(name), checkers.REWARD_FNS.meta(name)["spec"]
  output = "binary (0 or 1)" if spec.binary else f"a real in [{spec.low}, {spec.high}]"
  return [heading("reward_fn", name), "", _where(fn) + "  ", f"Returns: {output}", "",
          _md(inspect.getdoc(fn)), ""]


def _function_entry(fn: Callable) -> List[str]:
  return [f"### `{fn.__name__}`", "", _where(fn), "", _md(inspect.getdoc(fn)), ""]


def _anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
  kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
  return kept.replace(" ", "-")


def _entries(section: Section) -> List[str]:
  lines = []
  for family in section.families:
    for name in families()[family]:
      if family == "reward_fn":
        lines += _reward_entry(name)
      elif family == "transform":
        lines += _transform_entry(name)
      elif family in ALGORITHM_FAMILIES:
        lines += _registered_entry(family, name)
      else:
        lines += _piece_entry(family, name)
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

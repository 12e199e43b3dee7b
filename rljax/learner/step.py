"""The compiled part of an RL step: scoring a rollout, and the train_step.

``score`` runs one forward of each model (policy -> old log-probs, reference -> ref log-probs,
critic -> values), then the advantages, and returns the same ``Rollout`` record with those
fields filled. With one optimizer update per batch the policy's forward is left to the loss,
whose own forward gives the same log-probs (``old_logp`` stays None); with
``algo.old_logp='sampler'`` the old log-probs are the sampler's (``StepSpec.scoring_forward``).
Either way the scoring metrics (entropy, ...) then come from the update's forwards.
``train_step`` runs ``epochs x minibatches`` optimizer updates (``rljax.learner.update``), each accumulating gradients
over micro-batches with exact ``(sum, count)`` aggregation. The algorithm comes in resolved
(``rljax.algorithm.resolve``) and its float hyperparameters as a traced ``hp`` dict.

Transforms (``rljax.transforms``: controllers, rollout correction, token selections, ...) are
called through their hooks and never named here: ``score`` runs every ``on_score`` after the
estimator, ``minibatch_update`` every ``on_minibatch`` before splitting a minibatch and takes the
coefficients they drive from their state, the actor loss runs every ``on_loss``, and
``train_step`` every ``on_step`` once per RL step.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from rljax import algos, errors
from rljax.algos import losses as loss_lib
from rljax.algos import value as value_lib
from rljax.algorithm import Algorithm
from rljax.models import ModelConfig, lora, transformer
from rljax.parallel import context as context_lib
from rljax.rewards import shaping
from rljax.rollout.sampler import Rollout
from rljax.learner import packing
from rljax.learner import update as update_lib
from rljax.learner.compiled import compile_step_fns  # noqa: F401  (re-exported: build uses it)
from rljax.learner import state as state_lib
from rljax.learner.state import TrainState
from rljax.vision import multimodal
from rljax.transforms import Minibatch, Scored
from rljax.learner.update import scalar_metric

Metrics = dict  # name -> (sum, count)


def sequence_inputs(rollout: Rollout):
  """Prompt + completion ``tokens`` and ``attn_mask`` ``[B, S]`` for a teacher-forced forward.

  Multi-turn rollouts (``rljax.envs.episodes``) carry ``extras['source']`` [B, T] (0 padding, 1
  policy, 2 environment): the forward attends to policy *and* environment tokens (the
  observations the policy saw), while ``mask`` (the losses') stays on policy tokens only. A
  record whose rows hold several separate samples (an agent episode whose calls did not extend
  each other: ``rljax.agents.trajectory``) also carries ``extras['segment']`` [B, T] (1, 2, ...
  on every non-padding position, 0 on padding): ``attn_mask`` is then segment ids (the prompt
  in segment 1), so each sample's positions start at 0 and its attention stays within it."""
  tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1).astype(jnp.int32)
  extras = rollout.extras if isinstance(rollout.extras, dict) else {}
  completion = rollout.mask
  source = extras.get("source")
  if source is not None:
    completion = (source > 0) | (rollout.mask > 0)
  completion = completion.astype(jnp.int32)
  if extras.get("segment") is not None:
    completion = jnp.where(completion > 0, jnp.maximum(extras["segment"], 1), 0)
  attn = jnp.concatenate([rollout.prompt_mask.astype(jnp.int32), completion.astype(jnp.int32)],
                         axis=1)
  return tokens, attn


class Packed(NamedTuple):
  """How a forward takes a batch's rows packed (``rljax.learner.packing``): the ``layout``; the
  update's one chunk ``chunk`` (traced), or None for every used chunk (scoring), run in a scan
  ``side_by_side`` per iteration; ``place``: the chunk's rows constrained to the data shards;
  ``context``: each packed row's tokens split over a mesh axis (``RowSplit.context``)."""
  layout: packing.Layout
  chunk: jax.Array | None = None
  side_by_side: int = 1
  place: Callable = lambda tree: tree
  context: context_lib.Context | None = None


def _moe_rows(moe, rows: int):
  """The MoE routing of one forward as per-row arrays: routes [rows, S, L_moe, k], its
  load-balancing loss on every row, the dropped (token, expert) pairs spread over the rows."""
  if moe is None:
    return None
  return dict(routes=moe.routes, aux=jnp.broadcast_to(moe.aux_loss, (rows,)),
              dropped=jnp.broadcast_to(moe.dropped / rows, (rows,)))


def _completion_forward(model_cfg: ModelConfig, params, rollout: Rollout,
                        split: update_lib.RowSplit | Packed, head: str, out: Callable,
                        routes=None):
  """``(out(model, hidden, targets), moe)`` of a teacher-forced forward over ``rollout``:
  ``hidden`` [b, T, D] at the positions that predict the completion tokens ``targets`` [b, T]
  (position ``s`` predicts token ``s+1``); ``moe`` the MoE layers' routing (``_moe_rows``) or
  None; ``routes`` [B, S, L_moe, k]: experts to replay. The rows go through the model in the
  chunks ``split`` says (``update.map_rows``), or packed (``Packed``: ``_packed_forward``).
  Rows with images (``extras['images']``, ``multimodal.RowImages`` from the sampler) run the
  tower again over their own patches (``multimodal.forward_rows``)."""
  tokens, attn = sequence_inputs(rollout)
  images = rollout.extras.get("images") if isinstance(rollout.extras, dict) else None
  if images is not None and (split.context is not None or routes is not None):
    raise ValueError("rollouts with images are scored without mesh.context and without router "
                     "replay (not yet supported together)")
  if isinstance(split, Packed):
    return _packed_forward(model_cfg, params, tokens, attn, rollout.prompt_tokens.shape[1],
                           split, head, out, routes, images)
  s, t = tokens.shape[1], rollout.tokens.shape[1]

  def chunk_out(rows):
    tokens, attn, routes, images = rows
    if images is not None:
      hidden, model = multimodal.forward_rows(model_cfg, params, tokens, attn, images, head)
      return out(model, hidden[:, s - t - 1:s - 1], tokens[:, s - t:]), None
    if split.context is not None:
      per_token, moe = context_lib.per_token(model_cfg, params, tokens, attn, split.context,
                                             head, out, routes=routes)
      return (jax.tree.map(lambda a: a[:, s - t - 1:s - 1], per_token),
              _moe_rows(moe, tokens.shape[0]))
    hidden, model, moe = transformer.forward_with_routes(model_cfg, params, tokens, attn, head,
                                                         routes)
    return (out(model, hidden[:, s - t - 1:s - 1], tokens[:, s - t:]),
            _moe_rows(moe, tokens.shape[0]))
  return update_lib.map_rows(chunk_out, (tokens, attn, routes, images), split)


def _packed_forward(model_cfg: ModelConfig, params, tokens, valid, prompt_width: int,
                    split: Packed, head: str, out: Callable, routes=None, images=None):
  """``_completion_forward`` on packed rows: the forward and ``out`` run on ``[R, W]`` chunks
  of segments (the model's key mask is their segment ids), ``out``'s targets the next token of
  each segment; the per-token results come back to the completion's ``[B, T]`` layout by a
  gather (0 where the padded forward's would be masked: padding). One chunk (``split.chunk``):
  the rows of other chunks get 0 (the update's micro-batch); all: a scan over the chunks that
  skips the ones the layout leaves empty. Rows with images (``images``: ``RowImages``): the
  tower runs over every row's own patches once, and each token's input embedding (its image
  features at the placeholders) and M-RoPE position go to its packed slot with it, so each
  segment sees what its padded row sees."""
  lay = split.layout
  c, r, _ = lay.shape
  inputs = dict(tokens=packing.pack(tokens, valid, lay),
                segments=packing.segment_ids(valid, lay),
                targets=packing.next_tokens(tokens, valid, lay))
  if routes is not None:
    inputs["routes"] = packing.pack(routes, valid, lay)
  if images is not None:
    bound = transformer.bind(model_cfg, params, head)
    embeds, deepstack = multimodal.row_embeddings(model_cfg, bound, tokens, images)
    if deepstack is not None or getattr(multimodal.tower_module(model_cfg), "BLOCK_ATTENTION",
                                        False):
      raise errors.ConfigError(f"model.pack: packed rows with images take Qwen2.5-VL's tower only "
                               f"(not {model_cfg.model_type}'s DeepStack additions or two-way "
                               "image attention): use model.pack='auto' or False")
    inputs["embeds"] = packing.pack(embeds, valid, lay)
    positions = multimodal.row_positions(images, tokens.shape[1])  # [3, B, S]
    inputs["positions"] = packing.pack(jnp.moveaxis(positions, 0, -1), valid, lay)

  def run(index):
    x = split.place(jax.tree.map(lambda a: a[index], inputs))
    if images is not None:
      hidden, _, _ = bound(x["tokens"], jnp.moveaxis(x["positions"], -1, 0),
                           transformer.self_attention(model_cfg, x["segments"]),
                           embeds=x["embeds"], valid=x["segments"] > 0)
      return out(bound, hidden, x["targets"]), None
    if split.context is not None:
      y, moe = context_lib.per_token(model_cfg, params, x["tokens"], x["segments"],
                                     split.context, head, out, x["targets"], x.get("routes"))
      return y, (None if moe is None else (moe.routes, moe.aux_loss,
                                           jnp.asarray(moe.dropped, jnp.float32)))
    hidden, model, moe = transformer.forward_with_routes(model_cfg, params, x["tokens"],
                                                         x["segments"], head, x.get("routes"))
    return out(model, hidden, x["targets"]), (
        None if moe is None else (moe.routes, moe.aux_loss, jnp.asarray(moe.dropped, jnp.float32)))

  tokens_out = lambda y, chunk: jax.tree.map(
      lambda a: packing.completion(packing.unpack(a, valid, lay, chunk), valid, prompt_width), y)
  rows = tokens.shape[0]
  if split.chunk is not None:
    y, moe = run(split.chunk)
    if moe is not None:
      moe = dict(routes=packing.unpack(moe[0], valid, lay, split.chunk),
                 aux=jnp.broadcast_to(moe[1], (rows,)),
                 dropped=jnp.broadcast_to(moe[2] / rows, (rows,)))
    return tokens_out(y, split.chunk), moe
  first = run(0)  # always run: a batch's tokens start in chunk 0
  skip = lambda index: jax.tree.map(jnp.zeros_like, first)
  if c == 1:
    y, moe = jax.tree.map(lambda a: a[None], first)
  else:
    _, rest = jax.lax.scan(
        lambda carry, index: (carry, jax.lax.cond(index < lay.used_chunks, run, skip, index)),
        None, jnp.arange(1, c), unroll=min(split.side_by_side, c - 1))
    y, moe = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, rest)
  if moe is not None:
    chunk_of = lay.row // r
    rows_in = jnp.zeros((c,), jnp.float32).at[chunk_of].add(1.0)
    moe = dict(routes=packing.unpack(moe[0], valid, lay), aux=moe[1][chunk_of],
               dropped=moe[2][chunk_of] / rows_in[chunk_of])
  return tokens_out(y, None), moe


def policy_stats(model_cfg: ModelConfig, params, rollout: Rollout, chunk: int,
                 split: update_lib.RowSplit | Packed = update_lib.RowSplit(), routes=None):
  """``(logp [B, T], entropy [B, T], moe)`` of the completion tokens under ``params``; logits
  are built in sequence chunks of ``chunk``, never as a [B, T, V] array. ``moe``: None for a
  dense model, else ``{"routes": [B, S, L_moe, k], "aux": [B], "dropped": [B]}``, the experts
  the forward used, its load-balancing loss (on every row of its chunk) and the (token, expert)
  pairs capacity dispatch dropped (spread over the chunk's rows)."""
  def out(model, hidden, targets):
    return algos.token_logprobs_and_entropy(
        hidden, model.head_weight(), targets, chunk=chunk, softcap=model_cfg.final_logit_softcap)
  (logp, entropy), moe = _completion_forward(model_cfg, params, rollout, split, "lm", out, routes)
  return logp, entropy, moe


def completion_stats(model_cfg: ModelConfig, params, rollout: Rollout, chunk: int,
                     split: update_lib.RowSplit | Packed = update_lib.RowSplit()):
  """Log-probs and entropies of the completion tokens under ``params``: ([B, T], [B, T])."""
  return policy_stats(model_cfg, params, rollout, chunk, split)[:2]


def completion_values(model_cfg: ModelConfig, critic_params, rollout: Rollout,
                      split: update_lib.RowSplit | Packed = update_lib.RowSplit()):
  """``V[i, t]``: the critic's value of the state before completion token t, [B, T]."""
  return _completion_forward(model_cfg, critic_params, rollout, split, "value",
                             lambda model, hidden, _: model.values(hidden))[0]


def replayed_routes(model_cfg: ModelConfig, rollout: Rollout, *, in_update: bool):
  """The experts a policy forward replays (``model.router_replay``), or None (its router's).

  R3: the sampler's (``extras['sampler_routes']``) in every policy forward. R2: the old-log-prob
  forward's (``extras['routes']``, recorded by ``score``) in the update; with one update per
  batch and no old-log-prob forward, the update's forward is that forward, so it routes itself.
  """
  mode = model_cfg.router_replay
  if mode == "off" or not model_cfg.moe_layers or (mode == "R2" and not in_update):
    return None
  key = "sampler_routes" if mode == "R3" else "routes"
  if key not in rollout.extras:
    if mode == "R2":
      return None
    raise ValueError("model.router_replay='R3' needs the sampler's routes (extras"
                     "['sampler_routes']); this rollout has none")
  return rollout.extras[key]


def moe_metrics(rollout: Rollout, used_routes, mask) -> Metrics:
  """``moe/route_mismatch``: the fraction of (completion token, MoE layer) pairs whose predicting
  position's experts (as a set) differ between the forward and the sampler (the old-log-prob
  forward's; ``moe/route_mismatch_update``: the update's forward)."""
  sampler = rollout.extras.get("sampler_routes")
  if sampler is None:
    return {}
  p, t = rollout.prompt_tokens.shape[1], rollout.tokens.shape[1]
  at = lambda r: jnp.sort(r[:, p - 1:p + t - 1], axis=-1)  # [B, T, L_moe, k]
  differ = jnp.any(at(used_routes) != at(sampler), axis=-1).astype(jnp.float32)  # [B, T, L]
  weight = mask[:, :, None] * jnp.ones_like(differ)
  return {"moe/route_mismatch": ((differ * weight).sum(), weight.sum())}


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """What the compiled step closes over: the resolved algorithm, the architecture, the
  optimizers. ``reuse_policy_forward``: one optimizer update per batch, so the loss's forward
  gives the old log-probs (ratio 1) and scoring skips the policy forward; not when the old
  log-probs are needed before the update (KL in the reward) or the loss sees another mask
  (overlong filter), nor when a transform needs them (or ``H_old``) before the loss.
  ``scoring_forward``: whether ``score`` runs the policy's forward at all.
  ``aux_cfgs``: ``(transform name, architecture)`` of the transforms' frozen models (the
  distillation teacher); ``seed``: the run's (Clip-Cov's per-minibatch uniforms). ``forward_tokens``:
  the most tokens per data shard that one forward (and backward) takes at a time, 0 for no
  limit (``row_split``); ``row_shards``: how many data shards the rows are split over;
  ``side_by_side``: row chunks per scan iteration (``update.concurrent_chunks``);
  ``keep_rows``: a record's rows constrained to the data shards (``update.run_epochs``).
  ``pack``: ``model.pack`` (True, False or 'auto'), resolved per forward on ``platform``
  (``pack_shape``). ``context``: every forward's rows split over the mesh's context axis
  (``rljax.parallel.rules.context_layout``), or None."""
  algo: Algorithm
  model_cfg: ModelConfig
  actor_tx: optax.GradientTransformation
  critic_tx: optax.GradientTransformation | None
  logits_chunk: int
  critic_clip: float | None = None  # critic.value_clip
  aux_cfgs: tuple = ()
  seed: int = 0
  forward_tokens: int = 0
  row_shards: int = 1
  side_by_side: int = 1
  keep_rows: Callable = lambda tree: tree
  pack: bool | str = False
  platform: str = "cpu"
  context: context_lib.Context | None = None

  @property
  def reuse_policy_forward(self) -> bool:
    a = self.algo
    return (a.epochs == a.minibatches == 1 and a.kl_placement != "reward"
            and not a.overlong_filter and not a.needs_old_logp)

  @property
  def scoring_forward(self) -> bool:
    """Whether ``score`` runs the policy's forward: not where the loss's forward gives the old
    log-probs (``reuse_policy_forward``), nor with ``algo.old_logp='sampler'`` (they are the
    sampler's; config relations refuse the transforms that need that forward's ``H_old`` or
    experts). Without it the scoring metrics come from the update's forwards
    (``actor_loss``'s rows, ``train_step``)."""
    return not (self.reuse_policy_forward or self.algo.old_logp == "sampler")

  def row_split(self, rollout: Rollout, at_least: int = 1) -> update_lib.RowSplit:
    """Row chunks for a forward over ``rollout``'s rows: at least ``at_least`` (the micro-batches),
    more where a chunk would exceed ``forward_tokens`` (``update.row_parts``)."""
    rows = rollout.tokens.shape[0]
    seq_len = rollout.prompt_tokens.shape[1] + rollout.tokens.shape[1]
    parts = update_lib.row_parts(rows, self.row_shards, seq_len, self.forward_tokens, at_least)
    return update_lib.RowSplit(parts, self.side_by_side, self.context)

  def pack_rows(self, rows: int, seq_len: int, at_least: int = 1) -> int:
    """Packed rows of ``seq_len`` tokens per chunk (``packing.chunk_rows``)."""
    return packing.chunk_rows(rows, seq_len, self.forward_tokens, self.row_shards, at_least)

  def pack_shape(self, rows: int, seq_len: int, at_least: int = 1) -> tuple | None:
    """``(C, R, W)``: the packed chunks (``pack_rows`` rows as wide as the padded ones) of a
    forward over ``rows`` rows of ``seq_len`` tokens, or None where ``model.pack`` resolves to
    the padded rows for it (``packing.packs``)."""
    return packing.packed_shape(self.pack, self.platform, rows, seq_len, self.forward_tokens,
                                self.row_shards, at_least, capacity=self.capacity_dispatch)

  @property
  def capacity_dispatch(self) -> bool:
    """Whether the policy's MoE layers dispatch by capacity (never packed: ``packing``)."""
    cfg = self.model_cfg  # None in a spec made for its layout alone
    return cfg is not None and bool(cfg.moe_layers) and cfg.moe_dispatch == "capacity"

  def describe_packing(self, rows: int, seq_len: int) -> str:
    """One start-up line: how ``model.pack`` resolves for scoring ``rows`` rows of ``seq_len``
    tokens and for the update's minibatches of them."""
    a = self.algo
    phases = []
    for name, n, at_least in (("scoring", rows, 1),
                              ("update", rows // a.minibatches, a.micro_batches)):
      shape = self.pack_shape(n, seq_len, at_least)
      phases.append(f"{name} padded" if shape is None else
                    f"{name} packed ({shape[0]} chunks of {shape[1]} rows)")
    return (f"packing: model.pack={self.pack} on {self.platform} -> {', '.join(phases)} for "
            f"rows of {seq_len} tokens (a batch of wider rows resolves anew; packed forwards "
            "log pack/fill and pack/update_fill)")

  def forward_split(self, rollout: Rollout, at_least: int = 1) -> update_lib.RowSplit | Packed:
    """How the forwards take ``rollout``'s rows: a first-fit-decreasing layout of its sequences
    in the chunks of ``pack_shape`` (the step's shapes stay those of the config), or where that
    is None, ``row_split``."""
    rows, completion = rollout.tokens.shape
    shape = self.pack_shape(rows, rollout.prompt_tokens.shape[1] + completion, at_least)
    if shape is None:
      return self.row_split(rollout, at_least)
    _, valid = sequence_inputs(rollout)
    return Packed(packing.layout(valid, shape), side_by_side=self.side_by_side,
                  place=self.keep_rows, context=self.context)


# --- scoring -------------------------------------------------------------------------------------

def scalar_metrics(values: dict) -> Metrics:
  return {k: scalar_metric(v) for k, v in values.items()}


def scoring_mask(rollout: Rollout):
  """``m`` [B, T] float32: the completion tokens of the rows that count (``row_valid``), the
  tokens the scoring metrics average over."""
  return rollout.mask.astype(jnp.float32) * rollout.row_valid.astype(jnp.float32)[:, None]


def scoring_metrics(learner: StepSpec, mask, logp, entropy, sampler_logp, ref_logp) -> Metrics:
  """Entropy, the sampler / policy log-prob gap (and 8.2's ``mismatch/``) and the KL estimate
  over the valid tokens of the whole batch: of the scoring forward, or without one of the
  update's forwards (``train_step``)."""
  gap = jnp.abs(logp - sampler_logp)
  metrics = {
      "entropy": loss_lib.token_metrics(mask, v=entropy)["v"],
      "logp_gap_mean": loss_lib.token_metrics(mask, v=gap)["v"],
      "logp_gap_max": scalar_metric(jax.lax.stop_gradient(jnp.where(mask > 0, gap, 0).max())),
  }
  if ref_logp is not None:
    metrics["kl"] = loss_lib.token_metrics(mask, v=learner.algo.kl(logp, ref_logp))["v"]
  if sampler_logp is not None:
    metrics.update(scalar_metrics(algos.mismatch_metrics(logp, sampler_logp, mask)))
  return metrics


def with_coefs(learner: StepSpec, state: TrainState, hp):
  """``hp`` with the coefficients the transforms drive from their state (the adaptive KL and
  entropy coefficients)."""
  hp = dict(hp)
  for t in learner.algo.transforms:
    if t.coefs is not None:
      hp.update(t.coefs(state.transforms[t.name]))
  return hp


def reference(learner: StepSpec, state: TrainState) -> tuple[ModelConfig, dict] | None:
  """``(architecture, params)`` of the KL reference, None without one: ``state.ref_params``, or
  for a policy with low-rank adapters its own base with the adapters off (the rank-0
  architecture on ``split_adapters(params)[0]``: no second copy of the weights)."""
  if state.ref_params is not None:
    return learner.model_cfg, state.ref_params
  if learner.algo.kl_placement is not None and learner.model_cfg.lora_rank:
    return learner.model_cfg.base, lora.split_adapters(state.params)[0]
  return None


def score(learner: StepSpec, state: TrainState, rollout: Rollout, hp, aux=None
          ) -> tuple[Rollout, Metrics]:
  """A rollout with rewards -> the same record with ``loss_mask``,
  ``old_logp`` (None when the loss provides it), ``ref_logp``, ``values``, ``returns``,
  ``advantages``, ``positive`` and the transforms' ``extras``. ``aux``: ``{transform name:
  params}`` of the transforms' frozen models (the distillation teacher), an argument so that
  they stay out of the TrainState."""
  algo, cfg, chunk = learner.algo, learner.model_cfg, learner.logits_chunk
  hp = with_coefs(learner, state, hp)
  row_valid = rollout.row_valid.astype(jnp.float32)
  mask = scoring_mask(rollout)
  old_logp = entropy = ref_logp = values = token_rewards = None
  split = learner.forward_split(rollout)
  moe_scoring = {}
  if algo.old_logp == "sampler":
    if rollout.sampler_logp is None:
      raise ValueError("algo.old_logp='sampler' needs the sampler's log-probs "
                       "(Rollout.sampler_logp); this rollout engine records none: use "
                       "algo.old_logp='recompute'")
    old_logp = rollout.sampler_logp.astype(jnp.float32)
  elif learner.scoring_forward:
    old_logp, entropy, moe = policy_stats(cfg, state.params, rollout, chunk, split,
                                          replayed_routes(cfg, rollout, in_update=False))
    if moe is not None:
      moe_scoring = moe_metrics(rollout, moe["routes"], mask)
      if cfg.router_replay == "R2":  # the update replays the experts of this forward
        rollout = rollout.replace(extras={**rollout.extras, "routes": moe["routes"]})
  if (ref := reference(learner, state)) is not None:
    ref_logp, _ = completion_stats(*ref, rollout, chunk, split)
  if state.critic_params is not None:
    values = completion_values(cfg, state.critic_params, rollout, split)
  rewards = rollout.rewards
  if isinstance(rollout.extras, dict) and "token_rewards" in rollout.extras:
    # Multi-turn rewards per turn (env.turn_discount): they replace the outcome on the last token.
    token_rewards = rollout.extras["token_rewards"].astype(jnp.float32) * row_valid[:, None]
  if algo.kl_placement == "reward":
    kl = dict(kl_coef=hp["kl_coef"], estimator=algo.kl_estimator)
    if token_rewards is None:
      token_rewards = algos.kl_reward_tokens(rollout.rewards, mask, old_logp, ref_logp, **kl)
    else:
      token_rewards = token_rewards + algos.kl_reward_penalty(mask, old_logp, ref_logp, **kl)
    # Outcome estimators (GRPO, RLOO, ...) read one reward per row: R_i plus the row's summed
    # penalty (RLOO's sequence-level KL reward; verl sums GRPO's token rewards the same way).
    rewards = rollout.rewards + algos.kl_reward_penalty(mask, old_logp, ref_logp, **kl).sum(1)
  extra = {}
  for t in algo.transforms:
    if t.advantage_inputs is not None:
      extra.update(t.advantage_inputs(rollout, algo.group_size))
  advantages, returns = algo.advantages(rewards=rewards, mask=mask, values=values,
                                        token_rewards=token_rewards, hp=hp, **extra)
  loss_mask = shaping.overlong_filter_mask(mask, rollout.truncated) if algo.overlong_filter \
      else mask
  aux_cfgs = dict(learner.aux_cfgs)
  view = Scored(rollout=rollout, hp=hp, group_size=algo.group_size, mask=mask,
                loss_mask=loss_mask, advantages=advantages, old_logp=old_logp, entropy=entropy,
                aux_logp=lambda name: completion_stats(aux_cfgs[name], aux[name], rollout,
                                                       chunk, split)[0])
  metrics = dict(moe_scoring)
  if isinstance(split, Packed):
    metrics["pack/fill"] = scalar_metric(split.layout.fill)
  for t in algo.transforms:
    if t.on_score is not None:
      changes, transform_metrics = t.on_score(view)
      view = view.apply(changes)
      metrics.update(transform_metrics)
  loss_mask, advantages = view.loss_mask, view.advantages
  metrics["advantage_mean"] = loss_lib.token_metrics(loss_mask, v=advantages)["v"]
  if learner.scoring_forward:
    metrics.update(scoring_metrics(learner, mask, old_logp, entropy, rollout.sampler_logp,
                                   ref_logp))
  if values is not None:
    # How much of the return variance the critic explained before this update.
    metrics["explained_variance"] = scalar_metric(
        value_lib.explained_variance(values, returns, mask))
  positive = value_lib.positive_example_rows(
      jnp.where(row_valid > 0, rollout.rewards, rollout.rewards.min())).astype(jnp.float32)
  scored = view.rollout.replace(loss_mask=loss_mask, old_logp=old_logp, ref_logp=ref_logp,
                                values=values, returns=returns, advantages=advantages,
                                positive=positive * row_valid)
  return scored, metrics


# --- losses --------------------------------------------------------------------------------------

def _loss_inputs(batch: Rollout) -> dict:
  """The arrays a component may read by name, for the tokens the losses see: the record's
  fields and the transforms' extras (``cov_sel``, ``is_weight``, ``entropy_keep``, ...)."""
  return dict(batch.extras, mask=batch.loss_mask, advantages=batch.advantages,
              old_logp=batch.old_logp, sampler_logp=batch.sampler_logp, ref_logp=batch.ref_logp,
              positive=batch.positive, rewards=batch.rewards)


def minibatch_counts(learner: StepSpec, minibatch: Rollout, parts: int) -> dict:
  """The denominator of every loss term over the whole minibatch (clamped at 1: an all-padding
  minibatch contributes a zero loss, not NaN), and the number of micro-batches ``parts``."""
  algo, arrays = learner.algo, _loss_inputs(minibatch)
  counts = {"policy": algo.policy_loss_count(minibatch.loss_mask),
            "value": value_lib.value_loss_count(minibatch.loss_mask)}
  counts.update({reg.name: reg.count(**arrays) for reg in algo.regularizers})
  counts = {k: jnp.maximum(v.astype(jnp.float32), 1.0) for k, v in counts.items()}
  counts["micro"] = jnp.asarray(parts, jnp.float32)
  return counts


def actor_loss(learner: StepSpec, params, coefs, micro: Rollout, counts,
               split: update_lib.RowSplit | Packed = update_lib.RowSplit()):
  """The policy objective plus every regulariser, each divided by its minibatch count:
  ``(loss, (metrics, rows))``, ``rows`` the forward's ``(logp, entropy)`` where scoring ran no
  policy forward (``StepSpec.scoring_forward``; ``train_step`` computes the scoring metrics from
  them over the whole batch), else None.
  ``split``: how the forward takes ``micro``'s rows (packed: one chunk, ``packed_micro``)."""
  algo = learner.algo
  logp, entropy, moe = policy_stats(learner.model_cfg, params, micro, learner.logits_chunk,
                                    split, routes=replayed_routes(learner.model_cfg, micro,
                                                                  in_update=True))
  arrays = _loss_inputs(micro)
  if micro.old_logp is None:
    arrays["old_logp"] = jax.lax.stop_gradient(logp)
  arrays.update(logp=logp, entropy=entropy)
  if moe is not None:  # the load-balancing loss of this forward, on each of its tokens
    arrays["router_aux"] = moe["aux"][:, None] * jnp.ones_like(logp)
  loss_sum, metrics = algo.policy_loss_sum(hp=coefs, **arrays)
  total = loss_sum / counts["policy"]
  metrics = dict(metrics, policy_loss=(loss_sum, counts["policy"] / counts["micro"]))
  if moe is not None:
    rows = jnp.asarray(moe["aux"].shape[0], jnp.float32)
    mismatch = moe_metrics(micro, moe["routes"], micro.loss_mask)
    if mismatch:
      metrics["moe/route_mismatch_update"] = mismatch["moe/route_mismatch"]
      if not learner.scoring_forward:  # scoring ran none: this forward's stands in for it
        metrics.update(mismatch)
    metrics["moe/aux_loss"] = (jax.lax.stop_gradient(moe["aux"]).sum(), rows)
    # (token, expert) pairs capacity dispatch dropped, per micro-batch forward
    metrics["moe/dropped"] = (moe["dropped"].sum(), jnp.ones((), jnp.float32))
  for reg in algo.regularizers:
    reg_sum = algo.regularizer_sum(reg, coefs, **arrays)
    total = total + coefs[reg.coef] * reg_sum / counts[reg.name]
    metrics[f"{reg.name}_loss"] = (reg_sum, counts[reg.name] / counts["micro"])
  for t in algo.transforms:
    if t.on_loss is not None:
      metrics.update(t.on_loss(arrays))
  rows = None if learner.scoring_forward else (jax.lax.stop_gradient(logp),
                                                jax.lax.stop_gradient(entropy))
  return total, (metrics, rows)


def critic_loss(learner: StepSpec, critic_params, micro: Rollout, counts,
                split: update_lib.RowSplit | Packed = update_lib.RowSplit()):
  values = completion_values(learner.model_cfg, critic_params, micro, split)
  loss_sum, metrics = value_lib.value_loss_sum(values, micro.values, micro.returns,
                                               micro.loss_mask, clip=learner.critic_clip)
  metrics = dict(metrics, value_loss=(loss_sum, counts["value"] / counts["micro"]))
  return loss_sum / counts["value"], metrics


# --- updates -------------------------------------------------------------------------------------

def select_tokens(learner: StepSpec, hp, step, minibatch: Rollout, index
                  ) -> tuple[Rollout, Metrics]:
  """The transforms' per-minibatch extras (Clip-Cov / KL-Cov selection, the 80/20 mask) over
  the whole minibatch, before it is split into micro-batches (so the split cannot change them)."""
  metrics = {}
  for t in learner.algo.transforms:
    if t.on_minibatch is not None:
      view = Minibatch(rollout=minibatch, hp=hp, seed=learner.seed, step=step, index=index)
      extras, transform_metrics = t.on_minibatch(view)
      minibatch = minibatch.replace(extras={**minibatch.extras, **extras})
      metrics.update(transform_metrics)
  return minibatch, metrics


def minibatch_update(learner: StepSpec, hp, state: TrainState, minibatch: Rollout, index, *,
                     update_actor: bool):
  """One optimizer step of the actor (and of the critic when there is one) on a minibatch;
  ``index`` counts the step's optimizer updates (epoch x minibatches + minibatch). Returns
  ``(state, (metrics, rows))``, ``rows`` the actor loss's (``actor_loss``) or None."""
  algo = learner.algo
  metrics, skipped, rows = {}, jnp.zeros((), jnp.int32), None
  hp = with_coefs(learner, state, hp)
  if update_actor:
    minibatch, metrics = select_tokens(learner, hp, state.step, minibatch, index)
  split = learner.forward_split(minibatch, at_least=algo.micro_batches)
  if isinstance(split, Packed):
    counts = minibatch_counts(learner, minibatch, split.layout.used_chunks)
    metrics["pack/update_fill"] = scalar_metric(split.layout.fill)
    accumulate = lambda loss_fn, params, **kw: update_lib.accumulate_chunks(
        lambda p, mb, index, c: loss_fn(p, *packed_micro(mb, split, index), c), params,
        minibatch, counts, chunks=split.layout.shape[0], used=split.layout.used_chunks,
        side_by_side=split.side_by_side, **kw)
  else:
    counts = minibatch_counts(learner, minibatch, split.parts)
    accumulate = lambda loss_fn, params, **kw: update_lib.accumulate_gradients(
        lambda p, mb, c: loss_fn(p, mb, update_lib.RowSplit(context=learner.context), c),
        params, minibatch, counts,
        parts=split.parts, side_by_side=split.side_by_side, **kw)
  if update_actor:
    # Gradients w.r.t. the trainable parameters only (the adapters, with LoRA; all but a frozen
    # tower); the frozen part enters the loss as a constant, so no gradient of it is computed.
    frozen, cfg = state.params, learner.model_cfg
    loss, grads, actor_metrics, rows = accumulate(
        lambda p, mb, mb_split, c: actor_loss(
            learner, state_lib.with_trainable(frozen, p, cfg), hp, mb, c, mb_split),
        state_lib.trainable(state.params, cfg), row_outputs=True)
    updated, opt_state, grad_norm, applied = update_lib.apply_update(
        learner.actor_tx, state_lib.trainable(state.params, cfg), state.opt_state, grads, loss)
    params = state_lib.with_trainable(state.params, updated, cfg)
    ref_params = state.ref_params
    if ref_params is not None:
      ref_params = algo.ref_update(ref_params, params, hp)
    state = state.replace(params=params, opt_state=opt_state, ref_params=ref_params)
    skipped += (~applied).astype(jnp.int32)
    metrics.update(actor_metrics, loss=scalar_metric(loss), grad_norm=scalar_metric(grad_norm))
  if state.critic_params is not None:
    closs, cgrads, critic_metrics = accumulate(
        lambda p, mb, mb_split, c: critic_loss(learner, p, mb, c, mb_split), state.critic_params)
    critic_params, critic_opt_state, cgrad_norm, capplied = update_lib.apply_update(
        learner.critic_tx, state.critic_params, state.critic_opt_state, cgrads, closs)
    state = state.replace(critic_params=critic_params, critic_opt_state=critic_opt_state)
    skipped += (~capplied).astype(jnp.int32)
    metrics.update(critic_metrics, critic_grad_norm=scalar_metric(cgrad_norm))
  metrics["update_skipped"] = scalar_metric(skipped > 0)
  return state.replace(skipped_updates=state.skipped_updates + skipped), (metrics, rows)


def packed_micro(minibatch: Rollout, split: Packed, index) -> tuple[Rollout, Packed]:
  """The micro-batch of packed chunk ``index``: the whole minibatch with the loss mask kept on
  the rows of that chunk (their forward outputs are the chunk's, the others' 0), and the split
  that runs that chunk. The rows' losses are those of a padded micro-batch of the same rows."""
  lay = split.layout
  in_chunk = (lay.row // lay.shape[1] == index).astype(minibatch.loss_mask.dtype)
  return (minibatch.replace(loss_mask=minibatch.loss_mask * in_chunk[:, None]),
          split._replace(chunk=index))


def _updates(learner: StepSpec, state: TrainState, batch: Rollout, hp, update_actor: bool):
  """``(state, metrics, rows)``: the updates, ``rows`` the actor loss's ``(logp, entropy)`` of
  each row in its first epoch (``update.run_epochs``), or None."""
  rng, shuffle_key = jax.random.split(state.rng)
  return update_lib.run_epochs(
      lambda s, mb, i: minibatch_update(learner, hp, s, mb, i, update_actor=update_actor),
      state.replace(rng=rng), batch, shuffle_key, epochs=learner.algo.epochs,
      minibatches=learner.algo.minibatches, indexed=True, keep_rows=learner.keep_rows,
      row_outputs=True)


def train_step(learner: StepSpec, state: TrainState, batch: Rollout, hp):
  """``epochs x minibatches`` updates on a scored batch, then every transform's ``on_step``
  (the adaptive KL and entropy coefficients). Where scoring ran no policy forward, the scoring
  metrics come from the update's: each row's log-probs and entropy under the parameters its
  first-epoch minibatch update started from (the batch's own for the first minibatch)."""
  state, metrics, rows = _updates(learner, state, batch, hp, update_actor=True)
  if rows is not None:
    metrics.update(scoring_metrics(learner, scoring_mask(batch), *rows, batch.sampler_logp,
                                   batch.ref_logp))
  transform_state = dict(state.transforms)
  for t in learner.algo.transforms:
    if t.on_step is not None:
      transform_state[t.name], step_metrics = t.on_step(transform_state[t.name], hp, batch,
                                                        metrics)
      metrics.update(step_metrics)
  return state.replace(step=state.step + 1, transforms=transform_state), metrics


def critic_step(learner: StepSpec, state: TrainState, batch: Rollout, hp):
  """Value pretraining: updates of the critic alone; the actor is not touched."""
  return _updates(learner, state, batch, hp, update_actor=False)[:2]


# --- compiled entry points -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StepFns:
  """``score(state, rollout, hp)``, ``train_step(state, batch, hp)`` and, with a critic,
  ``critic_step`` and ``score_mc`` (scoring with Monte-Carlo returns, for value pretraining)."""
  score: Callable
  train_step: Callable
  critic_step: Callable | None = None
  score_mc: Callable | None = None


def step_fns(learner: StepSpec, mc_learner: StepSpec | None = None) -> StepFns:
  """The pure (unjitted) step functions of ``learner``."""
  has_critic = learner.critic_tx is not None
  return StepFns(
      score=lambda state, rollout, hp, *aux: score(learner, state, rollout, hp, *aux),
      train_step=lambda state, batch, hp: train_step(learner, state, batch, hp),
      critic_step=(lambda state, batch, hp: critic_step(learner, state, batch, hp))
      if has_critic else None,
      score_mc=(lambda state, rollout, hp, *aux: score(
          mc_learner, state, rollout, monte_carlo_hparams(hp, mc_learner), *aux))
      if mc_learner is not None else None)


def monte_carlo_hparams(hp, mc_learner: StepSpec):
  """The run's ``hp`` with the Monte-Carlo ``lam_critic`` of value pretraining: the run's own
  ``lam_critic`` may be another number, or unset (then ``hp`` has no entry for it)."""
  return {**hp, "lam_critic": mc_learner.algo.hparams["lam_critic"]}

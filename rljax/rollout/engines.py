"""The rollout engine seam: what turns left-padded prompts into a ``Rollout``, and how weights
reach it. Training, evaluation, ``rljax eval``, ``rljax.load(...).sample`` and the asynchronous
sampler call an engine and nothing else (docs/rollout.md, "Writing a rollout engine").

A ``RolloutEngine`` holds the weights it samples with:

- ``transfer(params) -> (weights, metrics)``: the learner's parameters placed where the engine
  reads them (copied to its own devices, copied beside the learner's, or as they are); the
  metrics are the transfer's (``weights/sync_bytes``, ``weights/sync_sec``), empty when nothing
  moved. It must copy whatever the learner's next update would overwrite (donate).
- ``load_weights(weights, version)``: ``generate`` samples with these from now on; ``version``
  counts the learner steps behind them (``version``: the last one loaded). In-flight weight updates call it between the chunks of
  one rollout (``rljax.rollout.inflight``).
- ``generate(tokens [N, W], mask [N, W], key, sampling, group_size) -> Rollout`` (NumPy fields,
  ``N * group_size`` rows, groups contiguous): one call per batch of token ids.
- ``row_multiple``: every ``generate`` call's ``N`` must be a multiple of it (data shards).
- ``model_cfg``: the architecture it samples (stop ids, export, logging): a policy with low-rank
  adapters (``rljax.models.lora``) is sampled as its base architecture with the adapters merged
  into the kernels, merged by ``transfer`` (``EngineBase``, ``WeightSync``) at every publish, so
  the sampler can never decode weights older than those published.
- ``close()``: release what it holds (called when the run ends).

Rollout engines are registered by name (``@register_engine("name")``, ``ROLLOUT_ENGINES`` of
``rljax.registries``, filled by the modules of ``rljax.rollout``) and chosen once, at start-up, by
``rollout.engine``; a factory is called as ``factory(config, model_cfg, placement)``
(``Placement``: the sampler's mesh and shardings, whether it shares the learner's devices), and
declares the ``rollout.*`` keys only it reads (``reads``). Registered here: ``all_rows`` (every row
of a call decoded together, ``rljax.rollout.sampler``) and ``continuous`` (at most
``rollout.max_concurrent_rows`` / ``kv_cache_bytes`` rows at a time per data shard, freed slots
refilled: ``rljax.rollout.continuous``).

*Episode engines* are the other kind: multi-turn drivers (``rljax.envs.drivers``), registered with
``@register_episode_engine("name")`` (``EPISODE_ENGINES``) and chosen by ``env.engine``. One wraps
the run's rollout engine, ``factory(base, settings, tokenizer, prompt_bucket)``, and adds
``episodes(problems, key, sampling, group_size)``.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

import jax
import numpy as np

from rljax.registries import EPISODE_ENGINES, ROLLOUT_ENGINES
from rljax.models import lora, quantize
from rljax.models.config import ModelConfig
from rljax.rollout import sampler as sampler_lib
from rljax.rollout.record import Rollout
from rljax.rollout.sampling import SamplingParams
from rljax.rollout.speculative import Draft, make_draft


@runtime_checkable
class RolloutEngine(Protocol):
  model_cfg: ModelConfig
  row_multiple: int
  version: int  # of the weights loaded last (-1: none yet)

  def transfer(self, params) -> tuple[Any, dict]:
    """The learner's ``params`` placed where this engine reads them, and the transfer's
    metrics."""

  def load_weights(self, weights, version: int) -> None:
    """Sample with ``weights`` (``transfer``'s result) from now on."""

  def generate(self, tokens, mask, key, sampling: SamplingParams, group_size: int,
               images=None) -> Rollout:
    """``group_size`` completions of each left-padded prompt row (NumPy ``Rollout``);
    ``images``: the rows' images (``rljax.vision.multimodal.RowImages``) for a vision-language
    policy, carried in the record as ``extras['images']``; an engine without them refuses."""

  def close(self) -> None:
    """Release the weights and whatever else the engine holds."""


@runtime_checkable
class EpisodeEngine(RolloutEngine, Protocol):
  """A multi-turn driver: a ``RolloutEngine`` that also runs whole episodes."""

  def episodes(self, problems, key, sampling: SamplingParams, group_size: int):
    """``group_size`` episodes per problem: a result with ``rollout``, ``transcripts`` and
    ``counts`` (``rljax.envs.episodes.MultiTurnResult``)."""


class EngineBase:
  """What most engines share: the weights (``load_weights``), a ``transfer`` that hands the
  learner's parameters through as they are (an engine that keeps them beside a learner that
  donates them overrides it), ``row_multiple`` 1 and ``close``. A subclass writes
  ``generate``. Built with a policy that has adapters, ``model_cfg`` is its base architecture
  and ``transfer`` merges the adapters (``merged``)."""

  row_multiple = 1

  def __init__(self, model_cfg: ModelConfig):
    self.model_cfg = model_cfg.base
    self.adapters_cfg = model_cfg if model_cfg.lora_rank else None
    self.weights, self.version = None, -1

  def transfer(self, params) -> tuple[Any, dict]:
    return merged(self.adapters_cfg, params)

  def load_weights(self, weights, version: int) -> None:
    self.weights, self.version = weights, int(version)

  def generate(self, tokens, mask, key, sampling: SamplingParams, group_size: int,
               images=None) -> Rollout:
    raise NotImplementedError(f"{type(self).__name__} must define generate")

  def close(self) -> None:
    self.weights = None


# The merge of the adapters into their kernels (one fused ``W + (alpha/r) A @ B`` per kernel),
# one program per architecture and shardings, run at every publish.
_merge = jax.jit(lora.merge_adapters, static_argnums=1)


def merged(adapters_cfg: Optional[ModelConfig], params) -> tuple[Any, dict]:
  """``(params in the base layout, {'weights/merge_sec': wall time of the merge})`` for a policy
  with adapters (``adapters_cfg``: its architecture); ``(params, {})`` when it has none. The
  learner's parameters are never changed: the merged kernels are new buffers."""
  if adapters_cfg is None:
    return params, {}
  t0 = time.perf_counter()
  out = jax.block_until_ready(_merge(params, adapters_cfg))
  return out, {"weights/merge_sec": time.perf_counter() - t0}


# The weights a sampler holding FP8 kernels computes with, made once per publish in one program
# (compiled once per parameter shapes and shardings), never per decode step.
_round_trip = jax.jit(quantize.round_trip_weights, static_argnames="dtype")


class WeightSync:
  """Places the learner's weights where a JAX engine reads them (its ``transfer``).

  ``adapters_cfg`` (the policy's architecture when it has low-rank adapters, else None): the
  adapters are first merged into their kernels (``merged``), so the sampler decodes the base
  architecture with the newest weights. ``weight_dtype`` (``rollout.weight_dtype``; None = off):
  the layers' projection and expert kernels are then replaced by their per-channel round trip
  through that dtype (``rljax.models.quantize.round_trip_weights``), in a new tree: the
  learner's parameters are never changed. ``shardings`` (a pytree of the sampler's
  ``NamedSharding``s) when the sampler has devices of its own: ``jax.device_put`` copies the
  weights there. None when colocated: with ``copy`` (the asynchronous sampler) a copy on the same
  devices, because the learner's next update donates the buffers the sampler would still be
  reading; without it the weights themselves (the synchronous loop samples before the update, so
  no copy is needed).
  """

  def __init__(self, shardings=None, copy: bool = False, weight_dtype: Optional[str] = None,
               adapters_cfg: Optional[ModelConfig] = None):
    if weight_dtype is not None and weight_dtype not in quantize.WEIGHT_DTYPES:
      raise ValueError(f"rollout.weight_dtype={weight_dtype!r}: expected one of "
                       f"{quantize.WEIGHT_DTYPES} or None")
    self.shardings, self.copy, self.weight_dtype = shardings, copy, weight_dtype
    self.adapters_cfg = adapters_cfg

  @property
  def moves(self) -> bool:
    return (self.shardings is not None or self.copy or self.weight_dtype is not None
            or self.adapters_cfg is not None)

  def place(self, params):
    """``params`` (merged already) readable by the sampler (nothing copied where that is not
    needed), quantised first with ``weight_dtype``. The round trip's and the merge's untouched
    leaves (embeddings, norms) may be the learner's own buffers, so the copy below still applies
    to them."""
    if self.weight_dtype is not None:
      params = _round_trip(params, dtype=self.weight_dtype)
    if self.shardings is not None:
      return jax.device_put(params, self.shardings)
    if self.copy:
      return jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), params)
    return params

  def __call__(self, params) -> tuple[Any, dict]:
    """(the sampler's weights, ``weights/sync_bytes`` and ``weights/sync_sec``: bytes written to
    the sampler's devices, all shards, and the wall time until they are there, merge and
    quantisation included; ``weights/merge_sec``: the adapters' merge alone)."""
    if not self.moves:
      return params, {}
    t0 = time.perf_counter()
    params, metrics = merged(self.adapters_cfg, params)
    placed = jax.block_until_ready(self.place(params))
    sec = time.perf_counter() - t0
    nbytes = sum(s.data.nbytes for x in jax.tree.leaves(placed) for s in x.addressable_shards)
    return placed, {**metrics, "weights/sync_bytes": float(nbytes), "weights/sync_sec": sec}


# --- registries (rljax.registries: ROLLOUT_ENGINES filled by the modules of rljax.rollout,
# EPISODE_ENGINES by those of rljax.envs) ----------------------------------------------------------

def register_engine(name: str, *, reads: Sequence[str] = ()) -> Callable:
  """``@register_engine("name")`` on ``factory(config, model_cfg, placement) ->
  RolloutEngine``: selectable as ``rollout.engine='name'``; ``reads``: the ``rollout.*`` keys
  only this engine reads (another engine picked, they must keep their defaults)."""
  return ROLLOUT_ENGINES.register(name, reads=reads)


def register_episode_engine(name: str, *, reads: Sequence[str] = ()) -> Callable:
  """``@register_episode_engine("name")`` on ``factory(base, settings, tokenizer,
  prompt_bucket) -> EpisodeEngine`` (a multi-turn driver around the rollout engine ``base``):
  selectable as ``env.engine='name'``; ``reads``: the ``env.*`` keys only this driver reads."""
  return EPISODE_ENGINES.register(name, reads=reads)


# --- the JAX engines -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Placement:
  """Where an engine runs, from the mesh and the partition rules (``rljax.train.build``).

  ``mesh`` None: one device, nothing sharded (``rljax.load(...).sample``). Otherwise ``rows`` /
  ``replicated`` are the shardings of prompt rows and of the key, ``data_axes`` the mesh axes
  rows are split over (``row_multiple`` shards), ``param_sharding`` the weights' shardings on
  this mesh, ``colocated`` whether it is the learner's mesh; ``to_device(tree, shardings)`` /
  ``to_host(tree)`` move host values in and results out (every process takes part);
  ``context``: each row's KV cache striped over the mesh's context axis
  (``rljax.parallel.context.Context``), or None."""
  mesh: Any = None
  colocated: bool = True
  row_multiple: int = 1
  data_axes: tuple = ()
  rows: Any = None
  replicated: Any = None
  param_sharding: Any = None
  to_device: Callable = jax.device_put
  to_host: Callable = jax.device_get
  context: Any = None


# Compiled samplers shared by every engine of the process (notebooks, tests, eval after train):
# one per (architecture, sampling setting, group size, mesh, slot budgets, dtype).
_SAMPLERS: dict = {}


class JaxEngine(EngineBase):
  """The jitted KV-cache sampler (``rljax.rollout.sampler``) on a ``Placement``'s mesh, rows
  sharded over its data axes. ``max_concurrent_rows`` / ``kv_cache_bytes`` (0 = off) bound the
  rows decoded at once per data shard (continuous batching); ``dtype`` is the sampler's weight
  and KV-cache dtype (None = the model's); ``sync`` places the learner's weights; ``draft``:
  speculative decoding (``rljax.rollout.speculative``; None = off)."""

  def __init__(self, model_cfg: ModelConfig, placement: Placement = Placement(), *,
               max_concurrent_rows: int = 0, kv_cache_bytes: int = 0,
               dtype: Optional[str] = None, sync: Optional[WeightSync] = None,
               draft: Optional[Draft] = None):
    super().__init__(model_cfg)
    self.placement, self.dtype, self.draft = placement, dtype, draft
    if draft is not None and draft.kind == "layers" and draft.layers >= self.model_cfg.num_layers:
      raise ValueError(f"rollout.draft_layers={draft.layers}: the draft must have fewer layers "
                       f"than the policy's {self.model_cfg.num_layers}")
    self.max_concurrent_rows, self.kv_cache_bytes = max_concurrent_rows, kv_cache_bytes
    self.row_multiple = placement.row_multiple
    self.sync = sync or WeightSync(adapters_cfg=self.adapters_cfg)
    if self.sync.adapters_cfg != self.adapters_cfg:
      raise ValueError("the engine's weight sync must merge the adapters of the policy it "
                       "samples (weight_sync(config, placement, model_cfg))")

  @property
  def mesh(self):
    return self.placement.mesh

  def transfer(self, params) -> tuple[Any, dict]:
    return self.sync(params)

  def generate(self, tokens, mask, key, sampling: SamplingParams, group_size: int,
               images=None) -> Rollout:
    if self.weights is None:
      raise RuntimeError("the engine has no weights: load_weights first")
    p = self.placement
    budgets = dict(max_concurrent_rows=self.max_concurrent_rows,
                   kv_cache_bytes=self.kv_cache_bytes, dtype=self.dtype, draft=self.draft)
    if p.mesh is None:
      out = sampler_lib.sample(self.model_cfg, self.weights, tokens, mask, key, sampling,
                               group_size, images=images, **budgets)
      return jax.tree.map(np.asarray, out)
    # Every process holds the same prompts; each feeds its own rows of the global batch, and
    # every process gets all completions back (the verifiers see the whole batch).
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):  # a raw uint32 key
      key = np.asarray(key)  # (a typed key has no NumPy form: it is placed as it is)
    tokens, mask, key = p.to_device((tokens, mask, key), (p.rows, p.rows, p.replicated))
    if images is not None:  # split by rows like the prompts
      images = p.to_device(images, jax.tree.map(lambda _: p.rows, images))
    out = p.to_host(self._sampler(sampling, group_size)(self.weights, tokens, mask, key,
                                                        images=images))
    return jax.tree.map(np.asarray, out)

  def _sampler(self, sampling: SamplingParams, group_size: int):
    cache_key = (self.model_cfg, sampling, group_size, self.mesh, self.max_concurrent_rows,
                 self.kv_cache_bytes, self.dtype, self.draft)
    fn = _SAMPLERS.get(cache_key)
    if fn is None:
      # Weights stay sharded by the partition rules; prompts split as batch rows are.
      fn = _SAMPLERS[cache_key] = sampler_lib.make_sampler(
          self.model_cfg, sampling, group_size, mesh=self.mesh,
          data_axis=self.placement.data_axes, param_sharding=self.placement.param_sharding,
          max_concurrent_rows=self.max_concurrent_rows or None,
          kv_cache_bytes=self.kv_cache_bytes or None, dtype=self.dtype,
          context=self.placement.context, draft=self.draft)
    return fn


def weight_sync(config, placement: Placement, model_cfg: ModelConfig) -> WeightSync:
  """How the learner's weights reach a JAX engine: copied to its own devices (``mesh.
  sampler_devices``), copied on the same ones (an asynchronous colocated sampler), or read in
  place (the synchronous colocated loop); adapters of ``model_cfg`` merged first, then quantised
  with ``rollout.weight_dtype``."""
  dtype = config.rollout.weight_dtype
  adapters = model_cfg if model_cfg.lora_rank else None
  if placement.colocated:
    return WeightSync(copy=config.rollout.max_staleness > 0, weight_dtype=dtype,
                      adapters_cfg=adapters)
  return WeightSync(placement.param_sharding, weight_dtype=dtype, adapters_cfg=adapters)


# The keys of speculative decoding (rljax.rollout.speculative), read by both JAX engines.
DRAFT_KEYS = ("rollout.draft", "rollout.draft_tokens", "rollout.draft_ngram",
              "rollout.draft_layers")


def _draft(config) -> Optional[Draft]:
  r = config.rollout
  return make_draft(r.draft, r.draft_tokens, r.draft_ngram, r.draft_layers)


@register_engine("all_rows", reads=DRAFT_KEYS)
def all_rows_engine(config, model_cfg: ModelConfig, placement: Placement) -> JaxEngine:
  """Every row of a call decoded together until the last one stops (``rljax.rollout.sampler``),
  speculatively with ``rollout.draft`` (``rljax.rollout.spec_decode``)."""
  return JaxEngine(model_cfg, placement, dtype=config.rollout.dtype, draft=_draft(config),
                   sync=weight_sync(config, placement, model_cfg))


@register_engine("continuous", reads=("rollout.max_concurrent_rows", "rollout.kv_cache_bytes")
                 + DRAFT_KEYS)
def continuous_engine(config, model_cfg: ModelConfig, placement: Placement) -> JaxEngine:
  """At most ``rollout.max_concurrent_rows`` rows (and what ``rollout.kv_cache_bytes`` holds)
  decoding at once per data shard, a stopped row's slot refilled with the next pending row
  (``rljax.rollout.continuous``); with neither set, or more slots than rows, all rows at once.
  Speculatively with ``rollout.draft``: each slot verifies its drafts in the loop's forward."""
  r = config.rollout
  return JaxEngine(model_cfg, placement, max_concurrent_rows=r.max_concurrent_rows,
                   kv_cache_bytes=r.kv_cache_bytes, dtype=r.dtype, draft=_draft(config),
                   sync=weight_sync(config, placement, model_cfg))

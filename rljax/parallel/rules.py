"""Partition rules: logical axis names -> mesh axes, and the shardings built from them.

Every parameter carries a tuple of logical axis names (``rljax.models.transformer.logical_axes``); the
rule table below says which mesh axes (``rljax.parallel.mesh``: ``data``, ``fsdp``, ``expert``,
``context``, ``tensor``) each name is split over. The same table places parameters, optimizer state (which
mirrors the parameters), the reference model and critic (same model, same rules), batches and the
KV cache.

================  ================================  ================================================
logical name      mesh axes                         what it is
================  ================================  ================================================
``batch``         ``('data', 'fsdp', 'expert')``    rows of a batch / the KV cache (data parallel)
``vocab``         ``'tensor'``                      vocabulary of the embedding and LM head
``embed``         ``('fsdp', 'context')``           model width of weight matrices (FSDP / ZeRO-3)
``q_heads``       ``'tensor'``                      query heads x head dim of q/o projections
``kv_heads``      ``'tensor'``                      key/value heads (k/v projections, the KV cache)
``mlp``           ``'tensor'``                      MLP width (of the experts too)
``experts``       ``'expert'``                      E of stacked expert weights [E, D, F], [E, F, D]
``norm``          replicated                        RMSNorm scales
``lora_rank``     replicated                        rank r of the low-rank adapters A [in, r],
                                                    B [r, out] (which share their kernel's axes)
``length``        replicated                        sequence positions of activations
``cache_length``  ``'context'``                     slots of the KV cache (striped by the sampler)
``head_dim``      replicated                        per-head features of the KV cache
``act_embed``     replicated                        model width of activations [B, S, D]
``act_heads``     ``'tensor'``                      heads of activations
``act_mlp``       ``'tensor'``                      MLP width of activations
``act_vocab``     ``'tensor'``                      vocabulary of logits
``None``          replicated                        anything unnamed
================  ================================  ================================================

The ``context`` axis splits every row's tokens (``context_layout``: the forwards fold each row
into ``context`` stripes, ``rljax.models.ring``), not rows: batch rows are replicated over it, and
its devices share the weights' model width with ``fsdp`` (each holds ``1 / (fsdp x context)``,
gathered per layer as FSDP's are).

Only ``experts`` names the ``expert`` axis among the parameters, so every other weight is
replicated across it while batch rows are split over it: outside the MoE layers ``expert`` is one
more data-parallel axis (MaxText does the same), and ``expert=1`` is the layout without it.

Resolution of one array (``logical_to_spec``), dimension by dimension, left to right:

1. the rule's mesh axes, minus axes of size 1 and axes an earlier dimension already uses (a mesh
   axis shards at most one dimension: ``[B, S, D]`` with ``batch`` and ``embed`` puts ``fsdp`` on
   B only);
2. if the dimension's size is not divisible by the product of those axes' sizes, the longest
   prefix of them that divides it is used; with none, the dimension is replicated. These
   fallbacks are legal but cost memory, so they are reported (``fallbacks``, and ``rljax plan``
   prints them), never silent.

Override the table by passing ``rules=`` (a mapping or ``(name, axes)`` pairs) to any function
here; ``make_rules(overrides)`` merges overrides onto the defaults, e.g. pure data parallelism
with replicated weights: ``make_rules({'embed': None})``; sequence-sharded activations:
``make_rules({'length': 'tensor'})``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from rljax.config.table import MESH_AXES as AXES  # the mesh's axes (rljax.parallel.mesh)
from rljax.models.kv_cache import CACHE_AXES
from rljax.parallel import context as context_lib

DEFAULT_RULES: dict[str, Any] = {
    "batch": ("data", "fsdp", "expert"),
    "vocab": "tensor",
    "embed": ("fsdp", "context"),
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "experts": "expert",
    "norm": None,
    "lora_rank": None,
    "length": None,
    "cache_length": "context",
    "head_dim": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
}


def make_rules(overrides: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None) -> dict:
  """The default table with ``overrides`` applied (new logical names may be added)."""
  rules = dict(DEFAULT_RULES)
  if overrides is not None:
    items = overrides.items() if isinstance(overrides, Mapping) else overrides
    for name, axes in items:
      rules[name] = _axes_tuple(name, axes)
  return rules


def _axes_tuple(name, axes) -> tuple:
  if axes is None:
    return ()
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  for a in axes:
    if a not in AXES:
      raise ValueError(f"rule {name!r} -> {a!r}: mesh axes are {AXES}")
  return axes


def _table(rules) -> Mapping[str, Any]:
  if rules is None:
    return DEFAULT_RULES
  return rules if isinstance(rules, Mapping) else dict(rules)


@dataclasses.dataclass(frozen=True)
class Fallback:
  """A dimension that could not be split as its rule asks (size not divisible)."""
  dim: int
  name: str
  size: int
  wanted: tuple  # mesh axes the rule asked for (after dropping size-1 / already used axes)
  used: tuple  # mesh axes actually used (a prefix of ``wanted``; () = replicated)
  mesh_sizes: tuple  # sizes of ``wanted``

  def __str__(self):
    got = "replicated" if not self.used else "only " + "x".join(self.used)
    return (f"dim {self.dim} ({self.name}={self.size}) not divisible by "
            f"{'x'.join(self.wanted)}={math.prod(self.mesh_sizes)} -> {got}")


def resolve(axes: tuple, shape: tuple | None, mesh, rules=None) -> tuple[P, list[Fallback]]:
  """``(PartitionSpec, fallbacks)`` of an array with logical ``axes`` and ``shape`` on ``mesh``.

  ``shape=None`` skips the divisibility check (the caller guarantees it, e.g. batch rows).
  ``mesh`` is a ``Mesh`` or ``AbstractMesh`` (only axis names and sizes are read).
  """
  table = _table(rules)
  sizes = dict(mesh.shape)
  axes = tuple(axes)
  if shape is not None and len(shape) != len(axes):
    raise ValueError(f"logical axes {axes} do not match the rank of shape {tuple(shape)}")
  used: set = set()
  spec, notes = [], []
  for dim, name in enumerate(axes):
    if name is None:
      spec.append(None)
      continue
    if name not in table:
      raise KeyError(f"logical axis {name!r} has no partition rule; known: {sorted(table)}")
    target = _axes_tuple(name, table[name])
    for a in target:
      if a not in sizes:
        raise ValueError(f"rule {name!r} -> {a!r}, but the mesh has axes {tuple(sizes)}")
    wanted = tuple(a for a in target if sizes[a] > 1 and a not in used)
    chosen = wanted
    if shape is not None:
      while chosen and shape[dim] % math.prod(sizes[a] for a in chosen):
        chosen = chosen[:-1]
      if chosen != wanted:
        notes.append(Fallback(dim, name, int(shape[dim]), wanted, chosen,
                              tuple(sizes[a] for a in wanted)))
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
  return P(*spec), notes


def logical_to_spec(axes: tuple, shape: tuple | None, mesh, rules=None) -> P:
  """The ``PartitionSpec`` of an array with logical ``axes`` and ``shape`` (see module doc)."""
  return resolve(axes, shape, mesh, rules)[0]


def logical_sharding(mesh, axes: tuple, shape: tuple | None = None, rules=None) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def _is_axes(x) -> bool:
  return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def _map_axes(fn, logical_axes_tree, shapes_tree):
  """``fn(axes, shape_leaf)`` over params; axes tuples are leaves of the first tree."""
  return jax.tree.map(lambda axes, leaf: fn(axes, leaf), logical_axes_tree, shapes_tree,
                      is_leaf=_is_axes)


def param_shardings(mesh, logical_axes_tree, shapes_tree, rules=None):
  """``NamedSharding`` of every parameter: same tree as ``shapes_tree`` (arrays or
  ``ShapeDtypeStruct``s, e.g. ``transformer.param_shapes(cfg)``) with ``logical_axes_tree``
  (``transformer.logical_axes(cfg)``) naming each dimension."""
  return _map_axes(lambda axes, x: logical_sharding(mesh, axes, tuple(x.shape), rules),
                   logical_axes_tree, shapes_tree)


def fallbacks(mesh, logical_axes_tree, shapes_tree, rules=None) -> list[str]:
  """One line per parameter dimension that is replicated (or less split) than its rule asks."""
  out = []

  def check(path, axes, x):
    for note in resolve(axes, tuple(x.shape), mesh, rules)[1]:
      out.append(f"{jax.tree_util.keystr(path, simple=True, separator='/')}: {note}")
    return None

  jax.tree_util.tree_map_with_path(check, logical_axes_tree, shapes_tree, is_leaf=_is_axes)
  return out


def _key(k):
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return getattr(k, attr)
  return str(k)


def opt_state_shardings(mesh, opt_state_shapes, params_shardings, param_shapes=None):
  """Shardings of an optax state that mirrors the parameters.

  A leaf whose tree path ends with a parameter's path (``mu/layers_0/mlp/up_proj/kernel``) gets
  that parameter's sharding when its shape fits it (equal to the parameter's shape when
  ``param_shapes`` is given, else same rank and divisible); everything else (step counts,
  scalars, factored statistics) is replicated. ``opt_state_shapes`` is
  ``jax.eval_shape(tx.init, param_shapes)`` (or a real state).
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(params_shardings)
  by_path = {tuple(_key(k) for k in path): sh for path, sh in flat}
  shape_of = {}
  if param_shapes is not None:
    shape_of = {tuple(_key(k) for k in path): tuple(x.shape)
                for path, x in jax.tree_util.tree_flatten_with_path(param_shapes)[0]}
  rep = replicated(mesh)
  sizes = dict(mesh.shape)

  def fits(sh, shape, path):
    if param_shapes is not None:
      return shape_of.get(path) == shape
    spec = tuple(sh.spec) + (None,) * (len(shape) - len(sh.spec))
    if len(spec) != len(shape):
      return False
    for dim, entry in zip(shape, spec):
      names = () if entry is None else (entry,) if isinstance(entry, str) else entry
      if dim % math.prod(sizes[a] for a in names):
        return False
    return True

  def leaf_sharding(path, x):
    keys = tuple(_key(k) for k in path)
    shape = tuple(getattr(x, "shape", ()))
    for start in range(len(keys)):
      suffix = keys[start:]
      sh = by_path.get(suffix)
      if sh is not None and fits(sh, shape, suffix):
        return sh
    return rep

  return jax.tree_util.tree_map_with_path(leaf_sharding, opt_state_shapes)


def batch_spec(mesh, ndim: int, rules=None) -> P:
  return logical_to_spec(("batch",) + (None,) * (ndim - 1), None, mesh, rules)


def batch_sharding(mesh, ndim: int, rules=None) -> NamedSharding:
  """Rows (axis 0) split over the ``batch`` rule's axes (``data`` x ``fsdp`` x ``expert``), other
  axes replicated. The global number of rows must be a multiple of ``batch_divisor(mesh)``."""
  return NamedSharding(mesh, batch_spec(mesh, ndim, rules))


def batch_shardings(mesh, tree, rules=None):
  """Row shardings of every array of a record (e.g. a ``Rollout``), by each leaf's rank: the
  shardings follow from the fields present, whatever they are."""
  return jax.tree.map(lambda x: batch_sharding(mesh, x.ndim, rules), tree)


def batch_axes(rules=None) -> tuple:
  """The mesh axes batch rows are split over (the ``batch`` rule): what a ``shard_map`` over the
  data-parallel shards maps, and what error messages name."""
  return _axes_tuple("batch", _table(rules)["batch"])


def batch_divisor(mesh, rules=None) -> int:
  """How many shards batch rows are split into (``data * fsdp * expert`` with the default
  rules)."""
  spec = batch_spec(mesh, 1, rules)[0]
  names = () if spec is None else (spec,) if isinstance(spec, str) else spec
  sizes = dict(mesh.shape)
  return math.prod(sizes[a] for a in names)


def cache_shardings(mesh, cache, rules=None):
  """Shardings of the sampler's KV cache (``rljax.models.kv_cache``: per layer ``(k, v)``, each
  named by ``kv_cache.CACHE_AXES``): rows on the batch axes, kv heads on ``tensor`` (replicated
  where G does not divide)."""
  return jax.tree.map(lambda x: logical_sharding(mesh, CACHE_AXES, tuple(x.shape), rules), cache)


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def with_logical_constraint(x, axes: tuple, mesh, rules=None):
  """``jax.lax.with_sharding_constraint`` by logical names, inside jitted code (activations)."""
  return jax.lax.with_sharding_constraint(x, logical_sharding(mesh, axes, tuple(x.shape), rules))


def shard_params(params, shardings, *, donate: bool = False):
  """Place a tree of host or device arrays onto ``shardings`` (``jax.device_put``): parameters,
  optimizer state or any tree with matching shardings.

  The result never aliases ``params`` unless ``donate=True`` (then ``params`` may be deleted and
  its memory reused): donating the result to a jitted step cannot delete the caller's arrays. In
  multi-process runs every process must pass the same full values (use
  ``distributed.host_local_to_global`` for per-process data).
  """
  if donate:
    return jax.device_put(params, shardings, donate=True)
  # jax 0.10.2 shares the source buffer with a replica on the same device even with
  # ``may_alias=False``; an explicit copy of device-resident leaves keeps the promise above.
  params = jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, params)
  return jax.device_put(params, shardings)


def per_device_bytes(shapes_tree, shardings_tree) -> int:
  """Bytes one device holds of a tree of arrays/ShapeDtypeStructs placed by ``shardings_tree``
  (the largest shard, i.e. the device that holds the most)."""
  total = 0
  for x, sh in zip(jax.tree.leaves(shapes_tree), jax.tree.leaves(shardings_tree)):
    shard = sh.shard_shape(tuple(x.shape))
    total += int(np.prod(shard, dtype=np.int64)) * np.dtype(x.dtype).itemsize
  return total


def context_layout(mesh, rules=None) -> context_lib.Context | None:
  """How the forwards split rows over the mesh's ``context`` axis (``rljax.parallel.context``):
  rows over the ``batch`` rule's axes, heads over ``act_heads``'; None where the axis has one
  device."""
  return context_lib.layout(mesh, batch_axes(rules),
                            _axes_tuple("act_heads", _table(rules)["act_heads"]))

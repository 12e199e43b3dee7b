"""The parts of an update that any loss reuses: micro-batch gradient accumulation with exact
``(sum, count)`` aggregation, the guarded optimizer update, and epochs x minibatches in ``scan``.

A custom step (e.g. in a notebook) composes them around its own loss::

  def loss_fn(params, micro, counts):            # -> (loss, {name: (sum, count)})
    ...
  loss, grads, metrics = accumulate_gradients(loss_fn, params, minibatch, counts, parts=2)
  params, opt_state, info = apply_update(tx, params, opt_state, grads, loss)

Every loss term divides its micro-batch sum by a count of the *whole* minibatch (``counts``,
computed before the split), so how a minibatch is split never changes the gradient.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from rljax.algos.losses import scalar_metric  # noqa: F401  (re-exported)
from rljax.parallel.mesh import threads_per_device

Metrics = dict  # name -> (sum, count)


def split_rows(tree, parts: int):
  """``[N, ...] -> [parts, N / parts, ...]`` on every leaf; part j holds rows j, j + parts, ...
  (strided, so each part takes an equal share of every data-parallel shard)."""
  def split(x):
    n = x.shape[0]
    if n % parts:
      raise ValueError(f"{n} rows do not split into {parts} equal parts")
    return x.reshape((n // parts, parts) + x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, tree)


def merge_rows(tree):
  """The inverse of ``split_rows``: ``[parts, N / parts, ...] -> [N, ...]`` in row order."""
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape((-1,) + x.shape[2:]), tree)


class RowSplit(NamedTuple):
  """How a forward takes a batch's rows: ``parts`` chunks (``split_rows``) in a scan,
  ``side_by_side`` of them per iteration (``concurrent_chunks``); each row's tokens split over
  ``context`` (``rljax.parallel.context.Context``; None: one device holds a row)."""
  parts: int = 1
  side_by_side: int = 1
  context: Any = None


def map_rows(fn: Callable, tree, split: RowSplit):
  """``fn(tree)`` computed chunk by chunk as ``split`` says, merged back in row order; for a
  row-wise ``fn`` the result is ``fn(tree)``."""
  if split.parts == 1:
    return fn(tree)
  _, out = jax.lax.scan(lambda carry, rows: (carry, fn(rows)), None,
                        split_rows(tree, split.parts),
                        unroll=min(split.side_by_side, split.parts))
  return merge_rows(out)


# ``model.forward_tokens=-1`` on CPU: tokens per chunk per thread of a device (measured in
# docs/results/benchmarks/train_step.md: 1024 best on one thread; on two, larger chunks keep both
# busy).
CPU_FORWARD_TOKENS_PER_THREAD = 1024


def forward_tokens(value: int, platform: str) -> int:
  """``model.forward_tokens`` resolved: -1 (auto) is ``CPU_FORWARD_TOKENS_PER_THREAD`` per CPU
  thread of a device on CPU (``threads_per_device``) and no limit (0) on accelerators, where the
  whole batch in one pass is the fast layout."""
  if value != -1:
    return value
  return CPU_FORWARD_TOKENS_PER_THREAD * threads_per_device() if platform == "cpu" else 0


def concurrent_chunks(value: int, platform: str) -> int:
  """``model.parallel_chunks`` resolved: row chunks a scan iteration computes side by side.
  -1 (auto) is one per CPU thread of a device on CPU (``threads_per_device``), where XLA runs
  independent operations of an iteration on separate threads while its matmul fusions at a
  chunk's size keep to one thread (docs/results/benchmarks/train_step.md), and one on
  accelerators, where a chunk fills the device and a second would only add its activations."""
  if value != -1:
    return value
  return threads_per_device() if platform == "cpu" else 1


def row_parts(rows: int, shards: int, seq_len: int, max_tokens: int, at_least: int = 1) -> int:
  """How many parts ``split_rows`` should make of ``rows`` rows of ``seq_len`` tokens, sharded
  over ``shards``: ``at_least`` times the smallest divisor ``k`` of a shard's
  ``rows / shards / at_least`` rows for which one part holds at most ``max_tokens`` tokens per
  shard (one row per part when a row alone is longer). ``max_tokens=0``, or rows that do not
  divide so, leave ``at_least``. E.g. 64 rows, 1 shard, 136 tokens, 1024: 16 parts of 4 rows."""
  if not max_tokens or rows % shards or (rows // shards) % at_least:
    return at_least
  rest = rows // shards // at_least
  want = -(-rest * seq_len // max_tokens)
  return at_least * next(k for k in range(1, rest + 1) if rest % k == 0 and k >= min(want, rest))


def accumulate_gradients(loss_fn: Callable, params, minibatch, counts: Mapping[str, Any], *,
                         parts: int, side_by_side: int = 1, extra: tuple = (),
                         row_outputs: bool = False):
  """``(loss, grads, metrics)`` summed over ``parts`` micro-batches of ``minibatch`` (a scan,
  ``side_by_side`` micro-batches per iteration: their gradients are independent, only the sums
  wait for them, and the sums keep the order of one at a time).

  ``loss_fn(params, *extra, micro, counts) -> (loss, metrics)`` with each term already divided
  by its whole-minibatch count, so the sums are the minibatch's loss and gradient. With
  ``row_outputs``, ``loss_fn`` returns ``(loss, (metrics, rows))``, ``rows`` a pytree of per-row
  arrays of the micro-batch, and the call returns them too, merged back in the minibatch's row
  order: ``(loss, grads, metrics, rows)`` (e.g. the token log-probs of the loss's forward).
  """
  micro = split_rows(minibatch, parts)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  aux = (lambda a: a) if row_outputs else (lambda a: (a, None))

  def body(acc, part):
    (loss, out), grads = grad_fn(params, *extra, part, counts)
    metrics, rows = aux(out)
    return (jax.tree.map(jnp.add, acc[0], grads), acc[1] + loss,
            jax.tree.map(jnp.add, acc[2], metrics)), rows

  first = jax.tree.map(lambda x: x[0], micro)
  metric_shapes = aux(jax.eval_shape(grad_fn, params, *extra, first, counts)[0][1])[0]
  zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros(()),
           jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes))
  (grads, loss, metrics), rows = jax.lax.scan(body, zeros, micro,
                                               unroll=min(side_by_side, parts))
  if row_outputs:
    return loss, grads, metrics, merge_rows(rows)
  return loss, grads, metrics


def accumulate_chunks(loss_fn: Callable, params, minibatch, counts: Mapping[str, Any], *,
                      chunks: int, used, side_by_side: int = 1, row_outputs: bool = False):
  """``accumulate_gradients`` over micro-batches given by index: ``loss_fn(params, minibatch,
  index, counts)`` for ``index < used`` of ``chunks`` (a scan of static length whose iterations
  past ``used``, a traced count, compute nothing: ``lax.cond``). The packed update's chunks:
  their number varies with the batch's lengths, the compiled step does not.

  ``rows`` (with ``row_outputs``) are summed over the micro-batches: each gives its rows'
  values and 0 on the others'."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  aux = (lambda a: a) if row_outputs else (lambda a: (a, None))

  def compute(index):
    (loss, out), grads = grad_fn(params, minibatch, index, counts)
    metrics, rows = aux(out)
    return grads, loss, metrics, rows

  first = compute(0)  # always run: a batch's tokens start in chunk 0
  zeros = lambda index: jax.tree.map(jnp.zeros_like, first)

  def body(acc, index):
    return jax.tree.map(jnp.add, acc, jax.lax.cond(index < used, compute, zeros, index)), None

  grads, loss, metrics, rows = first if chunks == 1 else jax.lax.scan(
      body, first, jnp.arange(1, chunks), unroll=min(side_by_side, chunks - 1))[0]
  if row_outputs:
    return loss, grads, metrics, rows
  return loss, grads, metrics


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return jnp.stack(leaves).all() if leaves else jnp.ones((), bool)


def apply_update(tx: optax.GradientTransformation, params, opt_state, grads, loss):
  """One optimizer step, skipped when anything is non-finite: the loss, the gradient, or the
  updated parameters and optimizer state (``b2 = 1`` or an overflow can make them NaN from a
  finite gradient). Returns ``(params, opt_state, grad_norm, applied)``; a skipped step leaves
  params and optimizer state exactly as they were."""
  grad_norm = optax.tree.norm(grads)
  updates, new_opt_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  applied = (jnp.isfinite(loss) & jnp.isfinite(grad_norm) & _all_finite(new_params)
             & _all_finite(new_opt_state))
  keep = lambda new, old: jnp.where(applied, new, old)
  return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state),
          grad_norm, applied)


def run_epochs(minibatch_update: Callable, state, batch, key, *, epochs: int, minibatches: int,
               indexed: bool = False, keep_rows: Callable = lambda tree: tree,
               row_outputs: bool = False):
  """``epochs x minibatches`` calls of ``minibatch_update(state, minibatch) -> (state, metrics)``
  in ``lax.scan``; rows reshuffled each epoch from ``key`` (in order when there is one update).
  With ``indexed``, ``minibatch_update(state, minibatch, index)`` also gets the update's index
  ``epoch * minibatches + minibatch`` (int32). Returns the final state and the metrics summed
  over all updates.

  With ``row_outputs``, ``minibatch_update`` returns ``(state, (metrics, rows))``, ``rows`` a
  pytree of per-row arrays of its minibatch (or None), and the call returns
  ``(state, metrics, rows)``: the first epoch's rows (each row once) in the batch's row order.

  ``keep_rows(tree)``: the shuffled rows placed as the batch's were (a sharding constraint on
  the data axes). A gather of rows split over devices comes out replicated, and XLA then
  computed every minibatch's forward and backward whole on every device; one update takes the
  batch as it is (no gather)."""
  n = jax.tree.leaves(batch)[0].shape[0]
  shuffles = epochs * minibatches > 1

  def epoch(state, xs):
    epoch_key, e = xs
    order = jax.random.permutation(epoch_key, n) if shuffles else None
    shuffled = keep_rows(jax.tree.map(lambda x: x[order], batch)) if shuffles else batch
    if not indexed:
      state, out = jax.lax.scan(minibatch_update, state, split_rows(shuffled, minibatches))
    else:
      index = e * minibatches + jnp.arange(minibatches, dtype=jnp.int32)
      state, out = jax.lax.scan(lambda s, x: minibatch_update(s, *x), state,
                                (split_rows(shuffled, minibatches), index))
    if not row_outputs:
      return state, out
    metrics, rows = out
    rows = merge_rows(rows)  # in the shuffled order
    if shuffles and rows is not None:  # row order[i] of the batch is row i of the shuffled one
      rows = keep_rows(jax.tree.map(lambda x: jnp.zeros_like(x).at[order].set(x), rows))
    return state, (metrics, rows)

  state, out = jax.lax.scan(epoch, state, (jax.random.split(key, epochs),
                                           jnp.arange(epochs, dtype=jnp.int32)))
  sums = lambda metrics: jax.tree.map(lambda x: x.sum(axis=(0, 1)), metrics)
  if not row_outputs:
    return state, sums(out)
  metrics, rows = out
  return state, sums(metrics), jax.tree.map(lambda x: x[0], rows)

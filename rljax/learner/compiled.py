"""``jax.jit`` of the step functions with explicit shardings (``rljax.learner.step.StepFns``)."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from rljax.learner.state import TrainState


class _RowSharded:
  """``jax.jit`` of ``fn(state, rollout, hp, *extra)`` whose rollout shardings come from the
  record's fields (rows on the data axes, whatever fields are present): compiled once per
  structure. ``extra``: further arguments (the teacher's params) with ``extra_shardings``."""

  def __init__(self, fn, *, state_sharding, rows: Callable, replicated, donate: bool,
               extra_shardings: tuple = ()):
    self._fn, self._state, self._rows, self._rep = fn, state_sharding, rows, replicated
    self._donate, self._extra = donate, extra_shardings
    self._compiled: dict = {}

  def __call__(self, state, rollout, hp, *extra):
    return self._jitted(state, rollout, hp, *extra)(state, rollout, hp, *extra)

  def lower(self, state, rollout, hp, *extra):
    """The ``jax.stages.Lowered`` of a call with these arguments; after such a call its
    ``.compile()`` returns the executable the call used, not a new compilation (benchmarks read
    its ``memory_analysis()``)."""
    return self._jitted(state, rollout, hp, *extra).lower(state, rollout, hp, *extra)

  def _jitted(self, state, rollout, hp, *extra):
    key = (jax.tree.structure(rollout), len(extra))
    jitted = self._compiled.get(key)
    if jitted is None:
      out_state, _ = jax.eval_shape(self._fn, state, rollout, hp, *extra)
      out_first = self._state if isinstance(out_state, TrainState) else self._rows(out_state)
      jitted = self._compiled[key] = jax.jit(
          self._fn, in_shardings=(self._state, self._rows(rollout), self._rep)
          + tuple(self._extra[:len(extra)]),
          out_shardings=(out_first, self._rep), donate_argnums=(0,) if self._donate else ())
    return jitted


def compile_step_fns(fns, *, state_sharding, rows: Callable, replicated, aux_sharding=None):
  """``jax.jit`` each function with explicit shardings; the state is donated to the updates.

  ``rows(tree)`` gives the row shardings of a record's arrays; ``aux_sharding``: ``{name:
  shardings}`` of the transforms' frozen models, the optional last argument of ``score``.
  """
  def jit(fn, donate, extra=()):
    return None if fn is None else _RowSharded(fn, state_sharding=state_sharding, rows=rows,
                                               replicated=replicated, donate=donate,
                                               extra_shardings=extra)
  aux = () if aux_sharding is None else (aux_sharding,)
  return dataclasses.replace(
      fns, score=jit(fns.score, False, aux), train_step=jit(fns.train_step, True),
      critic_step=jit(fns.critic_step, True), score_mc=jit(fns.score_mc, False, aux))

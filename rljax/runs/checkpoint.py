"""Atomic, resumable checkpoints of the train state (orbax ``CheckpointManager``).

A checkpoint step holds two items::

  <directory>/<step>/state   the train-state pytree (arrays, sharded or not), StandardSave
  <directory>/<step>/extra   a JSON dict: data position, config, metrics so far, JsonSave

Guarantees ("fail loudly, lose nothing", DESIGN.md):

* **Atomic.** orbax writes every step into ``<step>.orbax-checkpoint-tmp-*`` and renames it (or,
  on object stores, writes ``commit_success.txt`` last). This wrapper additionally lists only step
  directories that contain ``commit_success.txt``, so a step directory that is not complete (an
  interrupted copy, a file system without atomic rename) is never chosen by ``latest_step``. Left
  over temporary directories of killed saves are removed when a ``Checkpointer`` opens.
* **Async.** ``save`` returns once the arrays are copied to host memory; the state may be donated
  to the next ``train_step`` right away. Writing finishes in a background thread; ``wait()``
  blocks until it is committed and re-raises its errors.
* **Any topology.** ``restore`` places every array on the sharding of the matching
  ``jax.ShapeDtypeStruct`` in ``abstract_state``: a state saved on N devices (or by several
  processes) restores onto a different mesh or a single process.
* **Exact trees.** Dict keys (``'layers_0'``...), ``None`` leaves (no critic, no reference model),
  optax states, python scalars and PRNG keys (raw ``uint32[2]`` ``jax.random.PRNGKey`` arrays and
  typed ``jax.random.key`` arrays alike) round-trip. orbax would silently fill ``None`` where the
  abstract state expects an array that the checkpoint lacks, and silently drop a saved array where
  the abstract state has ``None``; ``restore`` compares both trees first and raises instead.

Every process of a multi-process run must call ``save``/``restore``/``wait`` (orbax
synchronises them and lets the primary process write the shared files).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint.path import atomicity
from orbax.checkpoint.path import step as step_lib

from rljax.errors import RljaxError

logger = logging.getLogger(__name__)

STATE = "state"
EXTRA = "extra"
_COMMIT_FILE = "commit_success.txt"


class CheckpointError(RljaxError, RuntimeError):
  """A checkpoint that cannot be read or written; the message names it and the cause."""


class Checkpointer:
  """Keeps the ``keep`` most recent checkpoints of a run under ``directory``.

  Args:
    directory: where step directories live (local path or a URL orbax understands, ``gs://``).
    keep: number of most recent checkpoints kept (>= 1); older ones are deleted after a save.
    async_save: write in a background thread (``save`` returns after the device-to-host copy).
    saved: ``saved(state) -> the part of it written`` (and, applied to an abstract state, the
      part read back): e.g. the adapters of a policy whose frozen base is read from its source
      (``rljax.learner.state.saved_part``); default: all of it. ``restore`` then returns that
      part, which the caller completes.
  """

  def __init__(self, directory: str | os.PathLike, *, keep: int, async_save: bool = True,
               read_only: bool = False, saved=None):
    self._saved = saved or (lambda state: state)
    if not isinstance(keep, int) or keep < 1:
      raise ValueError(f"train.keep_checkpoints must be an integer >= 1, got {keep!r}")
    self.directory = _absolute(directory)
    self.read_only = read_only
    self._step_format = _committed_step_format()
    if read_only and not self.directory.exists():
      raise CheckpointError(f"no checkpoint directory {self.directory}")
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(keep),
        step_name_format=self._step_format,
        # Leftover `<step>.orbax-checkpoint-tmp-*` directories are saves that were killed midway:
        # they can never be restored, so they are removed rather than accumulating. Not by a
        # reader (eval, convert): in a live run's directory they are saves in progress.
        cleanup_tmp_directories=not read_only,
        enable_async_checkpointing=async_save,
        create=not read_only,
        read_only=read_only,
    )
    # item_handlers (rather than item_names) also lets `item_metadata` read the saved tree, which
    # `restore` compares with the abstract state.
    self._manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={STATE: ocp.StandardCheckpointHandler(),
                       EXTRA: ocp.JsonCheckpointHandler()})

  # --- queries ------------------------------------------------------------------------------

  def all_steps(self) -> list[int]:
    """Committed (or being committed by this object) steps, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest committed step, or None when there is none.

    The listing is read when the ``Checkpointer`` opens and then kept up to date by ``save``;
    steps written by another process into the same directory later are not seen.
    """
    return self._manager.latest_step()

  # --- save -----------------------------------------------------------------------------------

  def save(self, step: int, state: Any, extra: Mapping[str, Any], force: bool = False) -> bool:
    """Start saving ``state`` and ``extra`` as checkpoint ``step``; returns whether it saves.

    Args:
      step: the training step the state is at.
      state: pytree of jax arrays (any sharding), python scalars and ``None`` subtrees.
      extra: JSON-serialisable dict (numpy/jax scalars and arrays are converted to python
        numbers/lists, tuples become lists). Dict keys must be strings.
      force: also block until the checkpoint is committed (the final save, or one before a
        pre-emption), so that write errors surface here and the process may exit right after.

    A step that is already checkpointed is not written again (returns False): the state at a step
    is the same whichever call saves it, e.g. the final save after a periodic one. Saving a step
    older than the latest checkpoint raises: on resume the newer, stale checkpoint would win and
    this run's progress would be lost.
    """
    if self.read_only:
      raise CheckpointError(f"{self.directory} was opened read-only; not saving step {step}")
    step = int(step)
    if step in self._manager.all_steps():
      logger.info("checkpoint %d already exists in %s; not saved again", step, self.directory)
      if force:
        self.wait()
      return False
    latest = self.latest_step()
    if latest is not None and step < latest:
      raise ValueError(
          f"cannot save checkpoint {step}: {self.directory} already holds the newer checkpoint "
          f"{latest}, which a resumed run would restore instead. Use a fresh train.run_dir, or "
          "delete the newer checkpoints.")
    self._set_aside_incomplete(step)
    args = ocp.args.Composite(**{STATE: ocp.args.StandardSave(self._saved(state)),
                                 EXTRA: ocp.args.JsonSave(to_json(extra))})
    # `force=True` only bypasses orbax's save-interval policy: when to save is the caller's call.
    saved = self._manager.save(step, args=args, force=True)
    if force:
      self.wait()
    return bool(saved)

  def _set_aside_incomplete(self, step: int) -> None:
    """Rename an uncommitted ``<step>`` directory so that the new save can take its name.

    Such a directory is not listed (no commit file), but orbax's final rename onto it would fail.
    It is moved aside, not deleted: it is not ours to destroy, and may help a post-mortem.
    """
    path = step_lib.build_step_path(self.directory, self._step_format, step)
    if jax.process_index() == 0 and path.exists():
      aside = path.parent / f"{path.name}.incomplete-{time.time_ns()}"
      logger.warning("checkpoint directory %s has no %s (an interrupted write); moved to %s",
                     path, _COMMIT_FILE, aside)
      path.rename(aside)
    ocp.multihost.sync_global_processes(f"rljax_checkpoint_set_aside_{step}")

  # --- restore --------------------------------------------------------------------------------

  def restore(self, step: int | None, abstract_state: Any, migrate=None) -> tuple[Any, dict]:
    """Read checkpoint ``step`` (None: the latest) onto the shardings of ``abstract_state``.

    Args:
      step: a committed step, or None for ``latest_step()``.
      abstract_state: the state's pytree with ``jax.ShapeDtypeStruct(shape, dtype,
        sharding=...)`` leaves (e.g. ``jax.eval_shape`` of the state's constructor with the
        target shardings attached), ``None`` where the state has None, python scalars as is.
        Live ``jax.Array`` leaves also work (their sharding is used).
      migrate: ``migrate(saved leaf paths, abstract_state) -> (abstract of the saved layout,
        convert) | None``: reads a checkpoint written in an older layout of the state and
        ``convert``s it (``rljax.learner.state.legacy_layout``).

    Returns:
      ``(state, extra)``: the state with the structure of ``abstract_state``, and the extra dict.
    """
    self.wait()  # a step still being written in the background is not readable yet
    if step is None:
      step = self.latest_step()
      if step is None:
        raise FileNotFoundError(f"no committed checkpoint in {self.directory}")
    step = int(step)
    if step not in self._manager.all_steps():
      raise FileNotFoundError(
          f"no committed checkpoint {step} in {self.directory}; committed: {self.all_steps()}")
    abstract_state = self._saved(abstract_state)
    _check_shardings(abstract_state)
    try:
      saved = self._manager.item_metadata(step)[STATE]
    except Exception as e:  # orbax's own errors: one line naming the checkpoint and the cause
      raise CheckpointError(self._cause(step, "unreadable metadata", e)) from e
    if saved is None:
      raise CheckpointError(f"checkpoint {self._path(step)}: no metadata for its state")
    saved_tree = getattr(saved, "tree", saved)
    convert = None
    if migrate is not None and (old := migrate(_leaf_paths(saved_tree), abstract_state)):
      abstract_state, convert = old
    _check_same_arrays(saved_tree, abstract_state, step)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(abstract_state), EXTRA: ocp.args.JsonRestore()}))
    except Exception as e:
      raise CheckpointError(self._cause(step, "cannot be restored", e)) from e
    state = restored[STATE] if convert is None else convert(restored[STATE])
    return state, restored[EXTRA]

  def differences(self, abstract_state: Any, migrate=None) -> tuple[int, list[str]] | None:
    """``(step, state_differences)`` of the newest committed checkpoint whose metadata reads
    (None: there is none), without reading any array: what ``restore`` would refuse, or orbax
    fail on, known before anything is loaded or written."""
    for step in reversed(self.all_steps()):
      try:
        saved = self._manager.item_metadata(step)[STATE]
      except Exception:  # unreadable: restore_latest reports it and falls back past it
        continue
      if saved is None:
        continue
      saved_tree = getattr(saved, "tree", saved)
      wanted = self._saved(abstract_state)
      if migrate is not None and (old := migrate(_leaf_paths(saved_tree), wanted)):
        wanted = old[0]
      return step, state_differences(saved_tree, wanted)
    return None

  def restore_latest(self, abstract_state: Any, log=logger.warning, migrate=None
                     ) -> tuple[int, Any, dict]:
    """``(step, state, extra)`` of the newest checkpoint that restores.

    A committed checkpoint that cannot be read (a truncated file, bad metadata) is reported with
    a warning naming it and the cause, set aside as ``<step>.corrupt-<time>`` (never deleted; not
    by a read-only reader), and the previous one is tried. Raises ``CheckpointError`` when none
    restores, and ``FileNotFoundError`` when there is none.
    """
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"no committed checkpoint in {self.directory}")
    failures = []
    for step in reversed(steps):
      try:
        state, extra = self.restore(step, abstract_state, migrate)
      except CheckpointError as e:
        failures.append(str(e))
        log(f"{e}; falling back to the previous checkpoint")
        if not self.read_only:
          self._set_aside(step, "corrupt")
        continue
      return step, state, extra
    raise CheckpointError(f"no checkpoint of {self.directory} restores: " + " | ".join(failures))

  def _path(self, step: int):
    return step_lib.build_step_path(self.directory, self._step_format, step)

  def _cause(self, step: int, what: str, error: Exception) -> str:
    cause = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"checkpoint {self._path(step)} {what}: {type(error).__name__}: {cause[:300]}"

  def _set_aside(self, step: int, why: str) -> None:
    """Rename checkpoint ``step`` to ``<step>.<why>-<ns>`` (kept for a post-mortem; a later save
    may reuse the step number) and forget it."""
    path = self._path(step)
    if jax.process_index() == 0 and path.exists():
      aside = path.parent / f"{path.name}.{why}-{time.time_ns()}"
      logger.warning("checkpoint %s set aside as %s", path, aside)
      path.rename(aside)
    ocp.multihost.sync_global_processes(f"rljax_checkpoint_set_aside_{why}_{step}")
    self._manager.reload()

  # --- lifetime -------------------------------------------------------------------------------

  def wait(self) -> None:
    """Block until every started save is committed (re-raises a failed background save)."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Wait for pending saves and release orbax's threads."""
    self.wait()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# --- helpers ------------------------------------------------------------------------------------

def _absolute(directory: str | os.PathLike) -> epath.Path:
  """orbax wants absolute paths; URLs (gs://...) are left alone."""
  text = os.fspath(directory)
  return epath.Path(text if "://" in text else os.path.abspath(text))


def _committed_step_format() -> step_lib.NameFormat:
  """Step names ``<step>``, listing only directories that hold ``commit_success.txt``.

  orbax's default on a POSIX file system trusts any directory named like a step (it relies on
  the rename being atomic). orbax also writes the commit file into the temporary directory before
  the rename, so requiring it loses no real checkpoint and rejects partial ones.
  """
  return step_lib.standard_name_format(temporary_path_cls=atomicity.CommitFileTemporaryPath)


def to_json(value: Any, where: str = "extra") -> Any:
  """``value`` with numpy/jax numbers and arrays made python, tuples made lists; raises TypeError
  (naming the offending key) on anything JSON cannot hold, instead of failing in orbax's thread."""
  if isinstance(value, Mapping):
    out = {}
    for key, item in value.items():
      if not isinstance(key, str):
        # json.dumps would turn 3 into "3" silently and the dict would not round-trip.
        raise TypeError(f"{where}: dict keys must be strings, got {key!r}")
      out[key] = to_json(item, f"{where}.{key}")
    return out
  if isinstance(value, (list, tuple)):
    return [to_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (np.generic, np.ndarray, jax.Array)):
    return np.asarray(jax.device_get(value)).tolist()
  raise TypeError(f"{where}: {type(value).__name__} is not JSON-serialisable")


def _path_str(path: tuple) -> str:
  """'opt/0/mu/layers_0/kernel' for a key path, whatever the node types (dict, attr, index)."""
  parts = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)


def _leaf_paths(tree: Any) -> set[str]:
  """Paths of the non-None leaves (empty containers, such as optax's EmptyState, have none)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
  return {_path_str(path) for path, leaf in leaves if leaf is not None}


def _leaf_shapes(tree: Any) -> dict[str, tuple]:
  """``{path: shape}`` of the non-None leaves (orbax's ArrayMetadata, ShapeDtypeStructs, arrays,
  python scalars)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
  return {_path_str(path): tuple(np.shape(leaf) if getattr(leaf, "shape", None) is None
                                 else leaf.shape)
          for path, leaf in leaves if leaf is not None}


def state_differences(saved_tree: Any, abstract_state: Any) -> list[str]:
  """``'path: why'`` for every array the checkpoint's tree and ``abstract_state`` disagree on: in
  one and not the other, or of another shape. (A dtype may differ: restoring casts.)"""
  saved, wanted = _leaf_shapes(saved_tree), _leaf_shapes(abstract_state)
  out = [f"{p}: not in the checkpoint" for p in sorted(set(wanted) - set(saved))]
  out += [f"{p}: only in the checkpoint" for p in sorted(set(saved) - set(wanted))]
  out += [f"{p}: checkpoint shape {saved[p]}, this config's {wanted[p]}"
          for p in sorted(set(saved) & set(wanted)) if saved[p] != wanted[p]]
  return out


def _check_same_arrays(saved_tree: Any, abstract_state: Any, step: int) -> None:
  """Raise unless the checkpoint and ``abstract_state`` hold values at the same paths.

  orbax restores ``None`` for an array the checkpoint lacks and drops a saved array where the
  abstract state has ``None`` (e.g. a critic enabled or disabled between save and resume).
  """
  saved, wanted = _leaf_paths(saved_tree), _leaf_paths(abstract_state)
  if saved == wanted:
    return
  lines = [f"checkpoint {step} does not match the state being restored:"]
  if wanted - saved:
    lines.append(f"  expected but not in the checkpoint: {sorted(wanted - saved)[:10]}")
  if saved - wanted:
    lines.append(f"  in the checkpoint but None/absent in the state: {sorted(saved - wanted)[:10]}")
  lines.append("  (was the config changed between the run that saved and this one?)")
  raise ValueError("\n".join(lines))


def _check_shardings(abstract_state: Any) -> None:
  """Every ShapeDtypeStruct needs a target sharding: without one orbax would reuse the saved
  sharding, which names devices that may not exist in this run."""
  leaves = jax.tree_util.tree_flatten_with_path(abstract_state)[0]
  missing = [_path_str(path) for path, leaf in leaves
             if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None]
  if missing:
    raise ValueError(
        "restore: abstract_state leaves need a sharding, e.g. jax.ShapeDtypeStruct(shape, dtype, "
        f"sharding=NamedSharding(mesh, spec)); missing at {missing[:10]}"
        + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))

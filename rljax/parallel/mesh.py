"""The device mesh: axes ``('data', 'fsdp', 'expert', 'context', 'tensor')`` over every device of
every process.

- ``data``:   pure data parallelism; parameters are replicated across it, batch rows split.
- ``fsdp``:   data parallelism that also shards parameters and optimizer state (ZeRO-3 style);
              batch rows are split across it too.
- ``expert``: expert parallelism; the stacked expert weights of mixture-of-experts layers are
              split by expert. Everything else treats it as a data axis (batch rows split, other
              parameters replicated), so no device idles in the dense parts (as MaxText does).
- ``context``: context (sequence) parallelism; every row's tokens are split over it, attention
              by a striped ring (``rljax.models.ring``), and the sampler's KV cache by slot.
              Weights and optimizer state are split over it as over ``fsdp``.
- ``tensor``: tensor (model) parallelism; attention heads, MLP width and vocabulary are split.

Sizes come from ``config.mesh`` (``data``, ``fsdp``, ``expert``, ``context``, ``tensor``); one of
them may be -1 and takes all devices the others leave. Which logical array dimension goes on which
axis is decided by the rule table in ``rljax.parallel.rules``. ``tensor`` is the innermost axis
(its activation all-reduces need the fastest links), ``context`` the next (its ring passes keys
and values to a neighbour in every layer), then ``expert`` (the expert exchange of every MoE
layer); with ``expert=1`` and ``context=1`` the mesh is the three-axis one of configs written
before they existed (a mesh config without ``context`` reads it as 1).
"""
from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from rljax.config.table import MESH_AXES
from rljax.parallel import distributed

AXES = MESH_AXES  # the mesh.* keys that lay devices out, in the mesh's order


_ADDED_AXES = {"context": 1}  # axes added after configs were written: their size when absent


def _read(mesh_cfg, key):
  if key in _ADDED_AXES and (key not in mesh_cfg if isinstance(mesh_cfg, Mapping)
                             else not hasattr(mesh_cfg, key)):
    return _ADDED_AXES[key]
  if isinstance(mesh_cfg, Mapping):
    if key not in mesh_cfg:
      raise KeyError(f"mesh config has no key {key!r}; it needs {AXES}")
    return mesh_cfg[key]
  if not hasattr(mesh_cfg, key):
    raise KeyError(f"mesh config has no key {key!r}; it needs {AXES}")
  return getattr(mesh_cfg, key)


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, ...]:
  """The axis sizes ``(data, fsdp, expert, context, tensor)`` (in ``AXES`` order) from ``mesh_cfg`` for
  ``num_devices`` devices.

  ``mesh_cfg`` is ``config.mesh`` (or a dict) with an integer key per axis of ``AXES``; at most
  one may be -1, meaning "all the devices the others leave". Errors name the key.
  """
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1, got {num_devices}")
  sizes = {}
  for key in AXES:
    v = _read(mesh_cfg, key)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or (v < 1 and v != -1):
      raise ValueError(f"mesh.{key} must be a positive integer or -1 (the rest), got {v!r}")
    sizes[key] = int(v)
  fill = [k for k, v in sizes.items() if v == -1]
  if len(fill) > 1:
    raise ValueError(f"only one mesh axis may be -1, got {', '.join('mesh.' + k for k in fill)}")
  fixed = math.prod(v for v in sizes.values() if v != -1)
  desc = ", ".join(f"mesh.{k}={v}" for k, v in sizes.items())
  if fill:
    if num_devices % fixed:
      others = [k for k in AXES if k != fill[0] and sizes[k] > 1]
      raise ValueError(
          f"{desc}: the product of {', '.join('mesh.' + k for k in others) or 'the fixed axes'} "
          f"= {fixed} does not divide the {num_devices} devices, so mesh.{fill[0]}=-1 cannot "
          "fill the rest")
    sizes[fill[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(f"{desc}: the mesh has {fixed} devices but {num_devices} are available; "
                     "set one axis to -1 to use all of them")
  return tuple(sizes[k] for k in AXES)


def cpu_threads() -> int:
  """The cores this process may run on (``taskset``), which XLA:CPU sizes its thread pool by."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_device() -> int:
  """The cores of this process per local CPU device (``mesh.cpu_devices``): what one device's
  program may keep busy."""
  return max(1, cpu_threads() // len(jax.local_devices(backend="cpu")))


def cpu_devices(config, cores: int) -> int:
  """``mesh.cpu_devices`` resolved for a machine of ``cores`` cores: -1 (auto) is the most
  devices, at most one per core, that a step's rows split over (``rollout.prompts_per_step``
  and each of the ``algo.minibatches x algo.micro_batches`` parts of the ``P x G`` rows)."""
  value = config.mesh.cpu_devices
  if value != -1:
    return value
  prompts = config.rollout.prompts_per_step
  part = prompts * config.rollout.group_size // (config.algo.minibatches
                                                  * config.algo.micro_batches)
  return max(d for d in range(1, max(cores, 1) + 1) if prompts % d == 0 and part % d == 0)


def start_cpu_devices(config) -> int | None:
  """Split the CPU into ``mesh.cpu_devices`` JAX devices, before JAX starts (``rljax train``).

  One XLA:CPU device keeps about one core and a half of two busy
  (docs/results/benchmarks/train_step.md); with a device per core each samples, scores and
  trains its own rows (the default mesh's ``data`` axis takes them all). Returns the count set,
  or None where it is not this call's to set: JAX already started (a notebook, a test session),
  ``XLA_FLAGS`` force a device count, several processes (``dist.*`` or a detected cluster) or
  the sampler's own devices (``mesh.sampler_devices``) lay the devices out, or the resolved
  count is 0 (JAX's default).
  """
  if ("xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
      or config.dist.coordinator_address or config.dist.num_processes
      or (config.dist.mode == "auto" and distributed.detect_cluster())
      or config.mesh.sampler_devices):
    return None
  count = cpu_devices(config, cpu_threads())
  if not count or count == jax.config.jax_num_cpu_devices:
    return None
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:  # JAX has started: its devices stay
    return None
  return count


def _num_slices(devices) -> int:
  return len({getattr(d, "slice_index", 0) for d in devices})


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ``Mesh`` with axes ``AXES`` (``('data', 'fsdp', 'expert', 'context', 'tensor')``) over
  ``devices``
  (default: all devices of all processes, ``jax.devices()``).

  Device order follows ``jax.make_mesh`` (TPU-topology aware; on GPU/CPU devices are in process
  order, so each process's devices are contiguous along the leading axes and it holds a
  contiguous block of batch rows). On multi-slice TPU (devices with several ``slice_index``
  values) the slices are laid along ``data`` (slow DCN links carry only gradient reductions),
  which then must be a multiple of the slice count. All axes are ``AxisType.Auto`` (classic
  GSPMD propagation inside ``jax.jit``).
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  types = (AxisType.Auto,) * len(AXES)
  slices = _num_slices(devices)
  if slices > 1:
    if shape[0] % slices:
      raise ValueError(f"mesh.data={shape[0]} must be a multiple of the {slices} TPU slices "
                       "(slices are connected by DCN and are laid along the data axis)")
    ici = (shape[0] // slices,) + shape[1:]
    dcn = (slices,) + (1,) * (len(AXES) - 1)
    arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    return Mesh(arr, AXES, axis_types=types)
  if len(devices) == 1 or devices[0].platform == "cpu":
    # Plain reshape: topology does not matter on CPU, and it keeps the order predictable.
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), AXES, axis_types=types)
  return jax.make_mesh(shape, AXES, axis_types=types, devices=devices)


def describe(mesh) -> str:
  """``data=2 fsdp=2 expert=1 context=1 tensor=2 (8 devices, 2 processes)``."""
  sizes = dict(mesh.shape)
  text = " ".join(f"{k}={sizes[k]}" for k in mesh.axis_names)
  n = math.prod(sizes.values())
  devices = getattr(mesh, "devices", None)
  if isinstance(devices, np.ndarray):
    procs = len({d.process_index for d in devices.flat})
    return f"{text} ({n} devices, {procs} process{'es' if procs > 1 else ''})"
  return f"{text} ({n} devices)"


# --- placement: the sampler on devices of its own ------------------------------------------------

PLACEMENT = ("sampler_devices", "learner_devices")  # the mesh section's keys beside AXES


def split_devices(mesh_cfg, devices: Sequence[jax.Device] | None = None
                  ) -> tuple[list, list | None]:
  """(learner devices, sampler devices or None when colocated) from ``mesh.sampler_devices`` and
  ``mesh.learner_devices``. Disjoint device sets let the sampler decode while the learner
  updates (asynchronous RL: AReaL arXiv 2505.24298, PipelineRL, verl's one-step-off-policy); the
  learner takes the first devices, the sampler the last. Errors name the keys."""
  devices = list(jax.devices() if devices is None else devices)
  n_sampler, n_learner = (int(_read_placement(mesh_cfg, k)) for k in PLACEMENT)
  if not n_sampler:
    if n_learner:
      raise ValueError(f"mesh.learner_devices={n_learner} needs mesh.sampler_devices > 0 (0 = "
                       "the sampler shares the learner's devices, which are all of them)")
    return devices, None
  n_learner = n_learner or len(devices) - n_sampler
  if n_learner < 1 or n_sampler + n_learner > len(devices):
    raise ValueError(f"mesh.sampler_devices={n_sampler} + mesh.learner_devices="
                     f"{_read_placement(mesh_cfg, 'learner_devices')} need more than the "
                     f"{len(devices)} devices there are (each side needs at least one)")
  return devices[:n_learner], devices[len(devices) - n_sampler:]


def _read_placement(mesh_cfg, key):
  """A placement key, 0 (colocated) where an older config has none."""
  if isinstance(mesh_cfg, Mapping):
    return mesh_cfg.get(key, 0)
  return getattr(mesh_cfg, key, 0)


def sampler_shape(num_devices: int) -> tuple[int, ...]:
  """The sampler's own mesh: data parallel over its devices (each decodes its rows with a full
  copy of the weights, as vLLM's data-parallel engines do); the learner's axes do not apply."""
  return (num_devices,) + (1,) * (len(AXES) - 1)


def make_meshes(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> tuple[Mesh, Mesh]:
  """(learner mesh, sampler mesh): the same mesh twice when colocated (the default)."""
  learner, sampler = split_devices(mesh_cfg, devices)
  learner_mesh = make_mesh(mesh_cfg, learner)
  if sampler is None:
    return learner_mesh, learner_mesh
  shape = sampler_shape(len(sampler))
  return learner_mesh, Mesh(np.asarray(sampler, dtype=object).reshape(shape), AXES,
                            axis_types=(AxisType.Auto,) * len(AXES))

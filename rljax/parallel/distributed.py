"""Multi-process start-up and per-process data feeding.

One Python process runs per host (TPU VM worker) or per GPU (SLURM task). ``initialize`` must be
called before anything touches a JAX device; afterwards ``jax.devices()`` lists the devices of
all processes and ``rljax.parallel.mesh.make_mesh`` builds the global mesh over them.

``config.dist``:

- ``mode='off'``: single process, never calls ``jax.distributed.initialize``.
- ``mode='auto'`` (default):
  1. ``coordinator_address`` set -> explicit start-up with ``num_processes`` and ``process_id``
     (both required); cluster auto-detection is switched off so SLURM variables cannot change
     which local devices this process sees;
  2. else a cluster environment is detected (Cloud TPU VM / GKE TPU, SLURM with more than one
     task, Open MPI's ``mpirun``) or ``JAX_COORDINATOR_ADDRESS`` is set ->
     ``jax.distributed.initialize()`` with no arguments (JAX reads the cluster itself);
  3. else single process.

Calling ``initialize`` again is a no-op. ``jax.distributed.initialize`` on SLURM gives each task
the GPU with its ``SLURM_LOCALID`` (one process per GPU: ``--ntasks-per-node`` = GPUs per node).
"""
from __future__ import annotations

import logging
import os
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from rljax.parallel import rules

logger = logging.getLogger(__name__)

_STATE: dict[str, Any] = {"method": None}


def _cfg(dist_cfg, key):
  if isinstance(dist_cfg, dict):
    return dist_cfg.get(key)
  return getattr(dist_cfg, key)


def detect_cluster() -> str | None:
  """Name of the multi-process environment this process runs in, or None.

  'tpu' (Cloud TPU VM or GKE TPU, as JAX's own detection sees it), 'slurm' (a job step with more
  than one task), 'mpi' (Open MPI), 'env' (``JAX_COORDINATOR_ADDRESS`` set).
  """
  try:  # JAX's own cluster detection (private API; guarded).
    from jax._src.clusters import cloud_tpu_cluster
    for cls in (cloud_tpu_cluster.GceTpuCluster, cloud_tpu_cluster.GkeTpuCluster):
      if cls.is_env_present():
        return "tpu"
  except Exception:  # pragma: no cover - API moved: fall back on environment variables
    if any(v in os.environ for v in ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS",
                                     "TPU_PROCESS_ADDRESSES")):
      return "tpu"
  slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
           "SLURM_LOCALID")
  if all(v in os.environ for v in slurm) and int(os.environ["SLURM_NTASKS"]) > 1:
    return "slurm"
  if "OMPI_MCA_orte_hnp_uri" in os.environ:
    return "mpi"
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    return "env"
  return None


def initialize(dist_cfg) -> str:
  """Start JAX's multi-process runtime per ``config.dist`` (see module doc); idempotent.

  Returns how this process started: 'off', 'single', 'explicit', 'tpu', 'slurm', 'mpi', 'env',
  or 'external' (someone else already called ``jax.distributed.initialize``).
  """
  if _STATE["method"] is not None:
    return _STATE["method"]
  mode = _cfg(dist_cfg, "mode")
  if mode not in ("auto", "off"):
    raise ValueError(f"dist.mode must be 'auto' or 'off', got {mode!r}")
  address = _cfg(dist_cfg, "coordinator_address") or ""
  num, pid = _cfg(dist_cfg, "num_processes"), _cfg(dist_cfg, "process_id")
  if mode == "off":
    if address or num is not None or pid is not None:
      raise ValueError("dist.mode='off' but dist.coordinator_address/num_processes/process_id "
                       "are set: use dist.mode='auto' for a multi-process run")
    method = "off"
  elif jax.distributed.is_initialized():
    method = "external"
  elif address:
    missing = [k for k, v in (("dist.num_processes", num), ("dist.process_id", pid)) if v is None]
    if missing:
      raise ValueError(f"dist.coordinator_address={address!r} needs {' and '.join(missing)}")
    if not 0 <= pid < num:
      raise ValueError(f"dist.process_id={pid} must be in [0, dist.num_processes={num})")
    logger.info("jax.distributed.initialize(%s, num_processes=%d, process_id=%d)", address, num,
                pid)
    jax.distributed.initialize(coordinator_address=address, num_processes=int(num),
                               process_id=int(pid), cluster_detection_method="deactivate")
    method = "explicit"
  elif num is not None or pid is not None:
    raise ValueError("dist.num_processes/dist.process_id are set but dist.coordinator_address "
                     "is empty: give all three (host:port of process 0), or none to auto-detect")
  else:
    cluster = detect_cluster()
    if cluster is None:
      method = "single"
    else:
      logger.info("jax.distributed.initialize() (auto-detected: %s)", cluster)
      jax.distributed.initialize()
      method = cluster
  _STATE["method"] = method
  return method


def is_main_process() -> bool:
  """True on process 0: the only one that writes logs, metrics and exports."""
  return jax.process_index() == 0


def process_batch_rows(global_batch: int, sharding=None) -> np.ndarray:
  """Sorted global row indices this process must supply for a batch of ``global_batch`` rows.

  Without ``sharding``: the ``process_index``-th of ``process_count`` equal blocks. With a batch
  sharding (``rules.batch_sharding(mesh, ndim)``): exactly the rows the process's devices hold
  (all rows when the batch is replicated across processes).
  """
  n, p = jax.process_count(), jax.process_index()
  if sharding is None:
    if global_batch % n:
      raise ValueError(f"global batch of {global_batch} rows is not divisible by the "
                       f"{n} processes")
    per = global_batch // n
    return np.arange(p * per, (p + 1) * per)
  ndim = len(sharding.spec) or 1
  shape = (global_batch,) + (1,) * (ndim - 1)
  rows = set()
  for idx in sharding.addressable_devices_indices_map(shape).values():
    rows.update(range(*idx[0].indices(global_batch)))
  return np.asarray(sorted(rows))


def process_batch_slice(global_batch: int, sharding=None) -> slice:
  """The contiguous block of rows this process feeds (see ``process_batch_rows``); an error if
  the sharding gives this process non-contiguous rows (feed ``process_batch_rows`` then)."""
  rows = process_batch_rows(global_batch, sharding)
  if len(rows) == 0 or rows[-1] - rows[0] + 1 != len(rows):
    raise ValueError("this process's rows are not one contiguous block; use "
                     "process_batch_rows(global_batch, sharding)")
  return slice(int(rows[0]), int(rows[-1]) + 1)


def to_host(tree):
  """numpy copies of (possibly multi-process sharded) arrays, the full global value on every
  process. A collective: every process must call it (``jax.device_get`` cannot fetch rows held by
  other processes). Use it for metrics, rollouts handed to Python verifiers, and exports."""

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))

  return jax.tree.map(one, tree)


def from_host(tree, shardings):
  """Place host values that are **identical on every process** (e.g. after ``to_host``) onto
  ``shardings`` (a sharding or a matching tree). Per-process rows: ``host_local_to_global``."""
  return jax.device_put(tree, shardings)


def host_local_to_global(array, mesh, sharding=None):
  """Assemble a global ``jax.Array`` from each process's own rows.

  ``array`` (or a pytree of arrays) holds this process's rows, ``global[process_batch_rows(...)]``;
  ``sharding`` defaults to ``rules.batch_sharding(mesh, ndim)``. Single process: a plain
  ``device_put``. Every process must call this with the same shapes.
  """
  def one(x):
    x = np.asarray(x)
    sh = sharding if sharding is not None else rules.batch_sharding(mesh, x.ndim)
    return jax.make_array_from_process_local_data(sh, x)

  return jax.tree.map(one, array)

"""``rljax plan``: will a config fit the devices? Per-device bytes of everything a run holds.

Nothing is allocated: parameter shapes come from ``transformer.param_shapes`` (abstract), shardings
from the same partition rules training uses (``rljax.parallel.rules``) on an ``AbstractMesh``, so
the figures include every replicated fallback. Model sizes come from ``plan.model`` (a name in
``MODEL_SHAPES``, or ``hf:PATH`` to a directory holding only a config.json) or ``model.source``.

What is counted (per device, the device holding the most):

- params, in ``model.param_dtype``; stacked MoE expert kernels split ``expert`` ways by their
  own rule (every other weight is replicated over that axis);
- optimizer state: ``jax.eval_shape`` of the run's optimizer (default: global-norm clipping +
  ``optax.adamw`` as ``rljax.learner.state.make_optimizer`` builds it: ``mu``, ``nu`` in the
  parameter dtype, no separate float32 master copy, scalar counts replicated), placed by
  ``rules.opt_state_shardings``;
- reference model (same shapes and rules as the policy) unless ``algo.kl_placement == 'none'``
  or the policy has low-rank adapters (``model.lora.rank`` > 0: its reference is its own frozen
  base, no copy). With adapters the params are the base (in ``model.lora.base_dtype``) plus the
  adapters, and the optimizer state and gradients are the adapters' only; the sampler reads the
  merged weights, a new copy of every adapted kernel made at each publish (counted in the
  rollout phase, and as the sampler's weights);
- critic (value model + its optimizer state and gradients) when ``critic.enabled``;
- gradients: one copy in the parameter dtype, two with more than one micro-batch (accumulator and
  the current micro-batch's gradients; ``algo.micro_batches``, or more where
  ``model.forward_tokens`` splits the rows: auto on CPU);
- rollout: KV cache ``2 x L x B x K x G x Dh`` in ``model.dtype`` with B = ``prompts_per_step x
  group_size`` rows split over the batch axes and K = prompt length + ``max_new_tokens`` (+ ``k +
  1`` with a speculative draft of ``k`` tokens: a verification's positions); the
  sampler grows its cache between decode segments, so at the last growth the previous cache
  (~``P + 3T/4`` slots) coexists with the final one; the prefill of one layer materialises
  ``[Pn, H, P, P]`` attention scores with the materialised backend (blockwise: one block of
  them; cuDNN/Pallas: none); FSDP-sharded weights are all-gathered for the forward: the
  worst case (XLA hoisting the gather out of the decode loop) is all weights / tensor; without
  FSDP but with ``expert > 1`` the expert weights alone (the sampler takes its parameters
  replicated, so every device decodes with all experts);
- train step activations for one micro-batch (on CPU, one per thread: they run side by side) of
  ``rows = P*G / minibatches / micro-batches / batch shards`` rows of
  ``S = prompt + max_new_tokens`` tokens (where ``model.pack`` resolves on for the update, a
  micro-batch is one packed chunk: ``R / batch shards`` rows of ``S``, ``R`` from
  ``rljax.learner.packing.packed_shape``, the chunks counted as micro-batches), per layer per token
  ``(ACT_D*D + ACT_QKV*(H+2G)*Dh + ACT_F*F) * dtype bytes`` (the tensors this decoder keeps for
  the backward pass: residual, float32 norm copies, q/k/v before and after RoPE, attention out,
  gate/up/silu/product) plus attention's own: with the materialised backend
  (``model.attention='xla'``) ``H*S`` scores per token at ``ATTN_BYTES`` + the compute dtype
  (float32 logits, softmax, compute-dtype probabilities: a ``T^2`` term); with a flash backend
  (blockwise, cuDNN, Pallas; what ``auto`` picks on every platform) the output and its
  log-sum-exp, ``H*(Dh*dtype + 4)`` per token, plus, for the pure-JAX blockwise one, one layer's
  ``rows x H x block^2`` float32 block temporaries (``BLOCK_TEMPS`` of them). Per
  ``model.remat``: ``none`` keeps all ``L`` layers; ``full`` only each layer's input
  ``[rows, S, D]`` and recomputes one layer at a time (``REMAT_LIVE_LAYERS`` layers' worth live in
  its backward); ``dots`` also keeps the weight matmuls' outputs the backward needs
  (``(H+2G)*Dh + D + 2F`` per token: q/k/v, o and gate/up; the down projection's output feeds
  only the block's residual add, so autodiff keeps nothing of it). MoE layers count as a dense
  MLP of width ``intermediate_size``: their dispatch tensors are not counted (the plan warns).
  With ``model.scan_layers`` (the layers under ``lax.scan``, remat on the scanned body) one layer
  is live in the backward at ``SCAN_LIVE_LAYERS`` layers' worth, also with remat
  ``none`` (its residuals sliced out of the stacked ones), plus the stacked copy of the layer
  weights and of their gradient (policy and critic). This is what XLA:CPU's accounting
  (``tests/models/test_long_sequence.py``) confirms; the unrolled layout's remat figures assume a
  compiler that keeps the recomputation apart (XLA:CPU merges it back into the forward and saves
  nothing, docs/results/benchmarks/long_sequence.md). Plus the chunked log-prob:
  ``rows x logits_chunk x V x 4 bytes x LOGITS_COPIES``, and all-gathered weights of
  ``GATHERED_LAYERS`` layers and the head (FSDP), of the expert kernels only the device's own
  ``E / expert`` experts: the train step does not gather them over ``expert``, XLA moves the
  tokens to the experts instead (an all-gather of the rows over ``expert``; measured on the
  8-device CPU mesh by ``tests/parallel/test_expert_8dev.py``).

**The context axis** (``mesh.context`` = N, ``rljax.parallel.context``): each row's tokens are
split N ways, so the activations, the log-prob chunk and the attention temporaries count
``ceil(S / N)`` tokens of a row per device, the KV cache ``ceil(K / N)`` of its slots (the rule
``cache_length -> context``), and the weights are split over ``fsdp x context`` (gathered per
layer as FSDP's are). Each layer's ring keeps its visiting keys and values and the next ones in
flight (and in the backward their float32 gradient accumulators): ``ring_buffers``. What the ring
sends is reported, not added to memory (``ring_transfers``): per layer, forward ``N - 1`` key/value
pieces (twice with remat: the backward recomputes the forward), backward ``N`` pieces with their
float32 gradients. Attention under a split is the blockwise kernel (cuDNN/splash return no
log-sum-exp to combine ring steps).

A vision-language policy's image tower (parameters, activations in the update and at the
prefill) and the image tokens of a prompt: ``rljax.plan_vision``.

The reward's own models (a reward model, an LLM judge: ``rljax.plan_rewards``) add their
weights to the resident state and their forward (or the judge's KV cache) as a third phase, and
their sources are checked: one that does not exist is an error, not a plan.

``peak = resident + max(rollout, train, reward)`` is compared with ``USABLE_FRACTION`` of the
device memory (room for XLA's own buffers and fragmentation).
"""
from __future__ import annotations

import functools
import math
import os
import re
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import AbstractMesh

from rljax.config.checks import ConfigError
from rljax.models import attention as attention_lib
from rljax.models import kv_cache as kv_cache_lib
from rljax.models import lora, transformer
from rljax.models.config import REMAT_CHOICES, ModelConfig, compute_dtype, lora_settings

from rljax.errors import StartupError
from rljax.loading import loader
from rljax.parallel import context as context_lib
from rljax.parallel import mesh as mesh_lib
from rljax.parallel import rules as rules_lib
from rljax.rollout import sampler as sampler_lib
from rljax.rollout import speculative
from rljax.learner import packing, update as update_lib
from rljax.learner.state import make_optimizer, total_updates, trainable
from rljax import plan_rewards, plan_vision

GiB = 1024 ** 3

# Documented constants of the activation estimate (see the module docstring).
ACT_D = 10  # D-wide tensors saved per layer per token (float32 norm copies count twice)
ACT_QKV = 2  # q, k, v before and after RoPE
ACT_F = 4  # gate, up, silu(gate), silu(gate) * up
ATTN_BYTES = 8  # float32 masked scores + float32 softmax (+ the compute-dtype probs, added below)
REMAT_LIVE_LAYERS = 2  # a rematerialised layer's forward recompute + its backward temporaries
SCAN_LIVE_LAYERS = 1.25  # the same under lax.scan (XLA:CPU reuses the buffers across iterations)
BLOCK_TEMPS = 2  # blockwise attention's live float32 [block, block] tiles (XLA fuses the rest)
LOGITS_COPIES = 3  # float32 logits, softmax / log-softmax, their gradient
GATHERED_LAYERS = 2  # FSDP all-gathers in flight during the train step
USABLE_FRACTION = 0.9

# Architectures for planning without weights (the Hugging Face config.json values).
MODEL_SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                         tie_embeddings=True, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
                         tie_embeddings=True, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                       num_layers=36, num_heads=16, num_kv_heads=2, head_dim=128,
                       tie_embeddings=True, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                       tie_embeddings=False, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-14b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824,
                        num_layers=48, num_heads=40, num_kv_heads=8, head_dim=128,
                        tie_embeddings=False, qkv_bias=True, model_type="qwen2"),
    "qwen2.5-32b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                        num_layers=64, num_heads=40, num_kv_heads=8, head_dim=128,
                        tie_embeddings=False, qkv_bias=True, model_type="qwen2"),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                      tie_embeddings=False, model_type="llama", rope_theta=500000.0),
    "llama3-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                       num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
                       tie_embeddings=False, model_type="llama", rope_theta=500000.0),
    "qwen3-30b-a3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
                          tie_embeddings=False, model_type="qwen3_moe", rope_theta=1000000.0,
                          num_experts=128, experts_per_token=8, moe_intermediate_size=768,
                          norm_topk_prob=True, moe_layers=tuple(range(48))),
}

# Memory per device. TPU: HBM per chip (one JAX device per chip; v4/v5p megacore). GPU: what
# CUDA reports as total memory.
DEVICE_MEMORY: dict[str, int] = {
    "v4": 32 * GiB,
    "v5e": 16 * GiB,
    "v5p": 95 * GiB,
    "v6e": 32 * GiB,
    "h100-80g": 81559 * 2 ** 20,
    "h200": 143771 * 2 ** 20,
    "a100-80g": 81920 * 2 ** 20,
    "a100-40g": 40960 * 2 ** 20,
}
_ALIASES = {"h100": "h100-80g", "a100": "a100-80g", "v5litepod": "v5e", "h200-141g": "h200"}
# TPU accelerator types name TensorCores for v4/v5p (2 per chip), chips for v5e/v6e.
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
_CHIPS_PER_HOST = {"v4": 4, "v5p": 4, "v5e": 4, "v6e": 4}

def _host_memory() -> int:
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

def _parse_bytes(text: str) -> int | None:
  """Bytes of ``70GiB``, ``8e10``, ``80 GB``...; None unless a positive, finite amount below
  2**64 (``1e400GB`` is infinite, ``0GB`` holds nothing)."""
  m = re.fullmatch(r"((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*(gib|gb|mib|mb|tib|tb)?",
                   text.strip().lower())
  if not m:
    return None
  unit = {None: 1, "gib": GiB, "gb": 10 ** 9, "mib": 2 ** 20, "mb": 10 ** 6, "tib": 1024 * GiB,
          "tb": 10 ** 12}[m.group(2)]
  amount = float(m.group(1)) * unit
  return int(amount) if math.isfinite(amount) and 1 <= amount < 2 ** 64 else None

_MAX_DEVICES = 2 ** 20  # far above any system; the mesh code overflows on counts past int32

def _check_count(spec: str, count: int, what: str) -> None:
  if not 1 <= count <= _MAX_DEVICES:
    raise ConfigError(f"device {spec!r}: {what} {count} is not between 1 and {_MAX_DEVICES}")

def parse_device(spec: str) -> dict:
  """``{'name', 'count' (None = from the mesh), 'bytes', 'hosts'}`` of a device description.

  TPU slices by accelerator type: ``v5p-64`` (64 TensorCores = 32 chips), ``v4-32``, ``v5e-16``,
  ``v6e-8``. GPUs/CPU as ``[N x]NAME``: ``8xh100-80g``, ``16xa100-80g``, ``h200``, ``cpu`` (host
  memory). Custom memory: ``[N x]BYTES`` with an optional unit (``8x80GB``, ``64x95GiB``), or
  ``NAME:BYTES`` to override a known device's memory (``h100-80g:70GiB``).
  """
  text = spec.strip().lower()
  override = None
  if ":" in text:
    text, mem = text.split(":", 1)
    override = _parse_bytes(mem)
    if override is None:
      raise ConfigError(f"device {spec!r}: cannot read memory {mem!r} (e.g. 70GiB, 8e10)")
  m = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", text)
  if m:
    kind = _ALIASES.get(m.group(1), m.group(1))
    cores, per_chip = int(m.group(2)), _CORES_PER_CHIP[kind]
    if cores < 1 or cores % per_chip:  # v5p-0 or v5p-1 named no whole chip (was read as one)
      raise ConfigError(f"device {spec!r}: {m.group(1)}-N counts "
                        + ("TensorCores, 2 per chip: N must be a positive even number "
                           "(v5p-8 = 4 chips)" if per_chip == 2 else
                           "chips: N must be at least 1 (v5e-8 = 8 chips)"))
    chips = cores // per_chip
    _check_count(spec, chips, "the chip count")
    return dict(name=spec, kind=kind, count=chips, bytes=override or DEVICE_MEMORY[kind],
                hosts=max(1, chips // _CHIPS_PER_HOST[kind]))
  m = re.fullmatch(r"(?:(\d+)\s*x\s*)?(.+)", text)
  count = int(m.group(1)) if m.group(1) else None
  if count is not None:
    _check_count(spec, count, "the count N of N x NAME")
  name = _ALIASES.get(m.group(2), m.group(2))
  if name == "cpu":
    memory = _host_memory()
  elif name in DEVICE_MEMORY:
    memory = DEVICE_MEMORY[name]
  else:
    memory = _parse_bytes(name)
    if memory is None:
      raise ConfigError(f"unknown device {spec!r}: use a TPU type (v5p-64, v4-32, v5e-16, v6e-8), "
                       f"[N x]NAME with NAME in {sorted(DEVICE_MEMORY) + ['cpu']}, or "
                       "[N x]BYTES with a positive, finite amount (e.g. 8x80GB)")
  hosts = None if count is None or name == "cpu" else max(1, math.ceil(count / 8))
  return dict(name=spec, kind=name, count=count, bytes=override or memory, hosts=hosts)

# --- inputs --------------------------------------------------------------------------------------

def _plan_key(config, key, default=None):
  if "plan" in config and key in config.plan and config.plan[key] is not None:
    return config.plan[key]
  return default

def model_config(config, model: str | None = None, device_kind: str = "cpu"
                 ) -> tuple[str, ModelConfig]:
  """(name, ModelConfig) to plan for: ``model`` argument, else ``plan.model``, else
  ``model.source`` ('hf:PATH' reads PATH/config.json only; 'tiny' uses ``config.model``, and so
  does 'sft': the cold start is trained with that architecture; 'run:DIR' the architecture of
  that run's config.json), computing in the dtype
  ``model.dtype`` gives on ``device_kind``."""
  m = config.model
  platform = "cpu" if device_kind == "cpu" else "accelerator"
  source = model or _plan_key(config, "model") or m.source
  if source in MODEL_SHAPES:
    dtypes = dict(dtype=compute_dtype(m.dtype, platform), param_dtype=m.param_dtype,
                  remat=m.remat, scan_layers=m.scan_layers, attention=m.attention,
                  attention_block=m.attention_block, **lora_settings(m, platform))
    return source, ModelConfig(**MODEL_SHAPES[source], **dtypes)
  try:
    kind = loader.source_of(config, "policy", source).kind
  except StartupError:
    raise ConfigError(f"cannot plan for model {source!r}: use one of {sorted(MODEL_SHAPES)}, "
                      "'hf:PATH' (a directory with config.json), 'run:DIR' or "
                      "model.source='tiny' or 'sft'") from None
  try:  # the architecture alone, as the run will read it (rljax.loading)
    return source, loader.architecture(config, "policy", text=source, platform=platform)
  except Exception as e:  # noqa: BLE001 - planning must not need the data stack
    if kind not in ("tiny", "sft"):
      raise
    raise ConfigError(f"model.source={source!r}: cannot read the vocabulary size from "
                      f"data.tokenizer={config.data.tokenizer!r} ({e})") from e

@functools.lru_cache(maxsize=16)
def _model_tree(cfg: ModelConfig, head: str = "lm"):
  """(logical axes, parameter shapes), cached: building the abstract model takes ~1 s at 7B."""
  return transformer.logical_axes(cfg, head), transformer.param_shapes(cfg, head)

def run_optimizer(config) -> optax.GradientTransformation:
  """The optimizer the trainer builds for ``config`` (``rljax.train.build.optimizers``): the plan
  counts the state the run will really hold."""
  return make_optimizer(config.optim, config.optim.lr, total_updates(config))

def planned_attention(backend: str, device_kind: str, context: int = 1) -> str:
  """The attention backend ``model.attention`` resolves to on ``device_kind`` (as
  ``rljax.models.attention.resolve_backend`` does on the device itself); with rows split over
  ``context > 1`` devices the ring's blockwise kernel (a fused one named is refused)."""
  if context > 1:
    try:
      context_lib.check_backend(backend, context)
    except ValueError as e:
      raise ConfigError(str(e)) from e
    return "blockwise"
  if backend != "auto":
    return backend
  platform = "tpu" if device_kind in _CORES_PER_CHIP else "cpu" if device_kind == "cpu" else "gpu"
  return attention_lib.auto_backend(platform)

# --- the plan ------------------------------------------------------------------------------------

def _tree_bytes(shapes) -> int:
  return sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(shapes))

def _expert_bytes(axes, shapes) -> int:
  """Bytes of the stacked expert kernels (the leaves with a logical ``experts`` axis)."""
  flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
  return sum(_tree_bytes(x) for ax, x in zip(flat_axes, jax.tree.leaves(shapes))
             if "experts" in ax)

def _layer_bytes(shapes, shardings) -> int:
  """Per-device bytes of the ``layers_i`` parameters (what ``scan_layers`` stacks)."""
  keys = [k for k in shapes if k.startswith("layers_")]
  return rules_lib.per_device_bytes({k: shapes[k] for k in keys},
                                    {k: shardings[k] for k in keys})

def layer_activations(layers: int, layer_input: int, dots_kept: int, layer_act: int,
                      scan: bool) -> dict:
  """Bytes the backward pass needs per ``model.remat`` policy (see the module doc).

  ``layer_input``: one layer's input [rows, S, D]; ``dots_kept``: its weight matmuls' outputs;
  ``layer_act``: all it keeps without remat. Unrolled: ``none`` keeps ``L`` layers, ``full``
  ``L`` inputs + ``REMAT_LIVE_LAYERS`` recomputed layers, ``dots`` also the matmul outputs.
  Scanned: the same kept tensors plus ``SCAN_LIVE_LAYERS`` layers live in the backward body.
  """
  live = SCAN_LIVE_LAYERS if scan else REMAT_LIVE_LAYERS
  return {"none": int(layers * layer_act + (SCAN_LIVE_LAYERS * layer_act if scan else 0)),
          "full": int(layers * layer_input + live * layer_act),
          "dots": int(layers * (layer_input + dots_kept) + live * layer_act)}

def block_bytes(d: int, h: int, g: int, dh: int, f: int, dtype_bytes: int, tokens: int,
                width: int, attention: str, tensor: int = 1) -> int:
  """One decoder-style block's live activations of a forward (no backward) over ``tokens``
  tokens of rows ``width`` wide: width ``d``, ``h`` query and ``g`` key/value heads of ``dh``,
  MLP width ``f``; the train step's per-token figures (``ACT_*``, attention's), heads split
  ``tensor`` ways where they divide."""
  t_div = lambda n: n // tensor if n % tensor == 0 else n
  b = dtype_bytes
  lin = (ACT_D * d + ACT_QKV * (t_div(h * dh) + 2 * t_div(g * dh)) + ACT_F * t_div(f)) * b
  attn = t_div(h) * (width * (ATTN_BYTES + b) if attention == "xla" else dh * b + 4)
  return tokens * (lin + attn)

def forward_layer_bytes(cfg: ModelConfig, tokens: int, width: int, attention: str,
                        tensor: int = 1) -> int:
  """One layer of ``cfg``'s ``block_bytes``."""
  return block_bytes(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                     cfg.intermediate_size, np.dtype(cfg.dtype).itemsize, tokens, width,
                     attention, tensor)

def _split(size: int, parts: int) -> int:
  """Per-device share of ``size`` split ``parts`` ways (rounded up)."""
  return -(-size // parts)

def train_micro_batches(config, device_kind: str, rows: int, shards: int, seq_len: int) -> int:
  """The micro-batches of one minibatch of ``rows`` rows that the train step runs:
  ``algo.micro_batches``, or more where ``model.forward_tokens`` splits the rows further."""
  limit = update_lib.forward_tokens(config.model.forward_tokens, device_kind)
  return update_lib.row_parts(rows, shards, seq_len, limit, config.algo.micro_batches)

def packed_update(config, device_kind: str, rows: int, shards: int, seq_len: int,
                  capacity: bool = False, setting=None) -> tuple | None:
  """``(C, R, W)``: the packed chunks the update's forwards take for a minibatch of ``rows`` rows
  where ``model.pack`` (or ``setting``: the policy's resolution of it, ``packing.pack_setting``)
  resolves on for it (``packing.packed_shape``; ``capacity``: MoE layers dispatched by capacity,
  never packed), else None."""
  setting = config.model.pack if setting is None else setting
  limit = update_lib.forward_tokens(config.model.forward_tokens, device_kind)
  return packing.packed_shape(setting, device_kind, rows, seq_len, limit, shards,
                              config.algo.micro_batches, capacity)

def ring_bytes(n: int, rows: int, seq_dev: int, kv_width: int, dtype_bytes: int, layers: int,
               remat: bool) -> dict:
  """The ring of ``n`` context devices over ``rows`` rows of ``seq_dev`` tokens each, with keys
  and values ``kv_width`` = G x Dh wide per token (module doc). ``buffers``: one layer's visiting
  and next keys and values (2 x 2 pieces), and in the backward their float32 gradients (2 x 2
  more); ``sent``: bytes one device sends per optimizer micro-batch, all layers (forward ``n-1``
  pieces, again when remat recomputes it; backward ``n`` pieces and their float32 gradients)."""
  if n == 1:
    return dict(buffers=0, sent=0)
  piece = rows * seq_dev * kv_width  # elements of one device's k (or v)
  buffers = piece * (2 * 2 * dtype_bytes + 2 * 2 * 4)
  forward = (n - 1) * 2 * piece * dtype_bytes
  backward = n * 2 * piece * (dtype_bytes + 4)
  return dict(buffers=buffers, sent=layers * (forward * (2 if remat else 1) + backward))

def plan(config, device: str | None = None, *, model: str | None = None,
         prompt_len: int | None = None, optimizer=None, rules=None) -> dict:
  """Per-device memory of a run of ``config`` on ``device`` (see module doc). Bytes throughout.

  ``device``/``model``/``prompt_len`` default to ``plan.device``/``plan.model``/``plan.prompt_len``
  when the config has a ``plan`` section; ``optimizer`` to the run's own (``run_optimizer``); ``rules`` to
  the default rule table.

  Where the sampler has devices of its own (``mesh.sampler_devices``, docs/async.md) both meshes
  are planned: the learner's devices hold the resident state and the train phase, the sampler's
  its weights (two copies when ``rollout.max_staleness > 0``: the newest published beside the
  one it decodes with) and the rollout phase; ``p['sampler']`` holds the latter and ``fits``
  needs both. An asynchronous colocated sampler adds its two weight copies to the resident state.
  """
  kwargs = dict(model=model, prompt_len=prompt_len, optimizer=optimizer, rules=rules)
  n_sampler = int(getattr(config.mesh, "sampler_devices", 0) or 0)
  copies = 2 if getattr(config.rollout, "max_staleness", 0) else 0
  if not n_sampler:
    p = _plan(config, device, **kwargs)
    if copies:
      weights = copies * p["bytes"]["sampler_params"]
      p["bytes"]["sampler_weights"] = weights
      p["resident"] += weights
      _set_peak(p)
      p["assumptions"].append("rollout.max_staleness > 0, colocated: the sampler's weight copies "
                              "(2 x params, the newest published and the one in use) are resident")
    return p
  total = _plan(config, device, count_only=True, **kwargs)
  n_learner = int(getattr(config.mesh, "learner_devices", 0) or 0) or total - n_sampler
  if n_learner < 1 or n_learner + n_sampler > total:
    raise ConfigError(f"mesh.sampler_devices={n_sampler} + mesh.learner_devices={n_learner}: the "
                      f"plan has {total} devices (each side needs at least one)")
  p = _plan(config, device, count=n_learner, **kwargs)
  sampler_config = config.copy_and_resolve_references()
  with sampler_config.unlocked():
    for axis, size in zip(mesh_lib.AXES, mesh_lib.sampler_shape(n_sampler)):
      sampler_config.mesh[axis] = size
  s = _plan(sampler_config, device, count=n_sampler, **kwargs)
  weights = max(copies, 1) * s["bytes"]["sampler_params"]
  sampler = dict(devices=n_sampler, mesh=s["mesh"], weights=weights, rollout=s["rollout"],
                 kv_cache=s["bytes"]["kv_cache"], peak=weights + s["rollout"],
                 usable=s["device"]["usable"])
  sampler["fits"] = sampler["peak"] <= sampler["usable"]
  p["sampler"] = sampler
  p["device"]["count"] = total
  # The rollout rows of the report are the sampler's devices'; the learner's peak has no rollout.
  for key in ("kv_cache", "kv_cache_growth", "prefill", "rollout_gathered_weights"):
    p["bytes"][key] = s["bytes"][key]
  for key in ("rollout_rows_per_device", "kv_heads_per_device", "prompts_per_device"):
    p["shapes"][key] = s["shapes"][key]
  p["rollout"] = s["rollout"]
  p["peak"] = p["resident"] + max(p["train"], p["reward"])  # the reward runs on the learner's
  p["fits"] = p["peak"] <= p["device"]["usable"] and sampler["fits"]
  p["warnings"] += [f"sampler: {w}" for w in s["warnings"] if w.startswith("rollout.")]
  return p

def _set_peak(p: dict) -> None:
  p["peak"] = p["resident"] + max(p["rollout"], p["train"], p["reward"])
  p["fits"] = p["peak"] <= p["device"]["usable"]

def _plan(config, device: str | None = None, *, model: str | None = None,
          prompt_len: int | None = None, optimizer=None, rules=None, count: int | None = None,
          count_only: bool = False):
  """``plan`` on one mesh of ``count`` devices (default: the device's); ``count_only``: just the
  device count."""
  device = device or _plan_key(config, "device")
  if not device:
    raise ConfigError("no device to plan for: pass one (e.g. 'v5p-64', '8xh100-80g', 'cpu') or "
                     "set plan.device")
  dev = parse_device(device)
  name, cfg = model_config(config, model, dev["kind"])
  count = count or dev["count"]
  if count is None:
    sizes = [config.mesh[k] for k in mesh_lib.AXES]
    if -1 in sizes:
      if dev["kind"] != "cpu":
        raise ConfigError(f"device {device!r} does not say how many devices (e.g. '8x{device}') "
                         "and the mesh has a -1 axis")
      count = jax.device_count()
    else:
      count = math.prod(sizes) + int(getattr(config.mesh, "sampler_devices", 0) or 0)
  if count_only:
    return count
  shape = mesh_lib.mesh_shape(config.mesh, count)
  mesh = AbstractMesh(shape, mesh_lib.AXES)
  sizes = dict(zip(mesh_lib.AXES, shape))
  tensor = sizes["tensor"]
  b = np.dtype(cfg.dtype).itemsize
  pb = np.dtype(cfg.param_dtype).itemsize
  tx = optimizer or run_optimizer(config)
  assumptions, warnings = [], []

  # --- resident state ---
  axes, shapes = _model_tree(cfg)
  p_sh = rules_lib.param_shardings(mesh, axes, shapes, rules)
  params = rules_lib.per_device_bytes(shapes, p_sh)
  # What the optimizer updates: every parameter, or only the adapters (``trainable``).
  train_shapes, train_sh = trainable(shapes, cfg), trainable(p_sh, cfg)
  opt_shapes = jax.eval_shape(tx.init, train_shapes)
  opt = rules_lib.per_device_bytes(
      opt_shapes, rules_lib.opt_state_shardings(mesh, opt_shapes, train_sh, train_shapes))
  fallbacks = rules_lib.fallbacks(mesh, axes, shapes, rules)
  reference = 0 if config.algo.kl_placement == "none" or cfg.lora_rank else params
  # The sampler's weights: the base layout (merged adapters), and the kernels the merge writes.
  (base_shapes, adapter_shapes), (base_sh, adapter_sh) = (lora.split_adapters(shapes),
                                                          lora.split_adapters(p_sh))
  adapters = rules_lib.per_device_bytes(adapter_shapes, adapter_sh)
  sampler_params = params - adapters
  merged = rules_lib.per_device_bytes(*(lora.merged_leaves(cfg, t) for t in (shapes, p_sh)))
  # Below, the weights' sizes are the base layout's in the parameter dtype (the sampler's
  # weights, FSDP's gathers, the scanned layers), whatever the frozen base's dtype.
  axes, shapes = _model_tree(cfg.base)
  p_sh = rules_lib.param_shardings(mesh, axes, shapes, rules)
  critic = critic_opt = critic_grads = 0
  if config.critic.enabled:
    c_axes, c_shapes = _model_tree(cfg, "value")
    c_sh = rules_lib.param_shardings(mesh, c_axes, c_shapes, rules)
    critic = rules_lib.per_device_bytes(c_shapes, c_sh)
    c_opt = jax.eval_shape(tx.init, c_shapes)
    critic_opt = rules_lib.per_device_bytes(
        c_opt, rules_lib.opt_state_shardings(mesh, c_opt, c_sh, c_shapes))
    fallbacks += [f"critic {f}" for f in rules_lib.fallbacks(mesh, c_axes, c_shapes, rules)]

  # --- rollout ---
  r = config.rollout
  prompt_len = int(prompt_len or _plan_key(config, "prompt_len", config.data.prompt_bucket))
  if prompt_len == config.data.prompt_bucket and not _plan_key(config, "prompt_len"):
    assumptions.append(f"prompt length = data.prompt_bucket = {prompt_len} tokens "
                       "(set plan.prompt_len for longer prompts)")
  # Speculative decoding writes a verification's k + 1 positions past the last token emitted.
  decode_tokens = r.max_new_tokens + speculative.verify_positions(speculative.make_draft(
      r.draft, r.draft_tokens, r.draft_ngram, r.draft_layers))
  slots, cache_slots = prompt_len + r.max_new_tokens, prompt_len + decode_tokens
  n_ctx = sizes["context"]
  seq_dev = _split(slots, n_ctx)  # a row's tokens on one device (context splits them)
  # The rows one decode loop holds at a time (continuous batching caps them) and the sampler's
  # real cache (shapes only): the plan follows the sampler's code, not a formula of its own.
  rows = r.prompts_per_step * r.group_size
  decode_rows = sampler_lib.slot_budget(cfg, rows, prompt_len, decode_tokens,
                                        r.max_concurrent_rows, r.kv_cache_bytes)
  # The sampler pads a striped cache to a multiple of the context devices.
  padded_slots = context_lib.padded_length(cache_slots, n_ctx)
  cache = jax.eval_shape(lambda: kv_cache_lib.init_cache(cfg, decode_rows, padded_slots))
  cache_shape = tuple(cache[0][0].shape)
  cache_spec, cache_notes = rules_lib.resolve(kv_cache_lib.CACHE_AXES, cache_shape, mesh, rules)
  fallbacks += [f"kv cache {n}" for n in cache_notes]
  shard = jax.sharding.NamedSharding(mesh, cache_spec).shard_shape(cache_shape)
  rows_dev = shard[kv_cache_lib.CACHE_AXES.index("batch")]
  g_dev = shard[kv_cache_lib.CACHE_AXES.index("kv_heads")]
  kv_cache = rules_lib.per_device_bytes(cache, rules_lib.cache_shardings(mesh, cache, rules))
  kv_growth = int(kv_cache * (prompt_len + 0.75 * r.max_new_tokens) / cache_slots) \
      if r.max_new_tokens > 16 else 0
  batch_shards = rules_lib.batch_divisor(mesh, rules)
  prompts_dev = _split(r.prompts_per_step, batch_shards)
  heads_dev = _split(cfg.num_heads, tensor if cfg.num_heads % tensor == 0 else 1)
  attention = planned_attention(cfg.attention, dev["kind"], n_ctx)
  blk = cfg.attention_block
  if attention == "xla":
    prefill = prompts_dev * heads_dev * prompt_len * prompt_len * (ATTN_BYTES + b)
  elif attention == "blockwise":
    prefill = (prompts_dev * heads_dev
               * attention_lib.balanced_block(_split(prompt_len, n_ctx), blk) ** 2 * 4
               * BLOCK_TEMPS)
  else:
    prefill = 0
  experts_w = _expert_bytes(axes, shapes)  # in the parameter dtype
  total_weights = _tree_bytes(shapes) // pb * b  # all weights in the compute dtype
  expert_weights = experts_w // pb * b
  zero3 = sizes["fsdp"] * n_ctx  # the weights' model width is split over fsdp x context
  split = [name for name, size, w in (("FSDP-sharded", zero3, total_weights),
                                      ("expert-split", sizes["expert"], expert_weights))
           if size > 1 and w]
  rollout_gather = (total_weights if zero3 > 1 else
                    expert_weights if sizes["expert"] > 1 else 0) // tensor
  batch_axes = " x ".join(rules_lib.batch_axes(rules))
  if r.prompts_per_step % batch_shards:
    warnings.append(f"rollout.prompts_per_step={r.prompts_per_step} does not split evenly over "
                    f"{batch_shards} batch shards ({batch_axes})")
  if split:
    assumptions.append(f"rollout all-gathers {' and '.join(split)} weights; counted in full "
                       "(/tensor) as the worst case (gather hoisted out of the decode loop)")

  # --- train step ---
  mb = config.algo.minibatches
  micro = train_micro_batches(config, dev["kind"], rows // mb, batch_shards, slots)
  # Packed (model.pack on for the update): a micro-batch is a chunk of R packed rows of the same
  # width, as many chunks as its layout has (the empty ones skipped, so never more memory).
  packed = packed_update(config, dev["kind"], rows // mb, batch_shards, slots,
                         bool(cfg.moe_layers) and cfg.moe_dispatch == "capacity",
                         packing.pack_setting(config.model.pack, cfg))
  if packed is not None:
    micro = packed[0]
    assumptions.append(f"model.pack={config.model.pack}: the update packed, chunks of "
                       f"{packed[1]} rows of {slots} tokens ({packed[0]} chunks a minibatch)")
  grads = rules_lib.per_device_bytes(train_shapes, train_sh) * (2 if micro > 1 else 1)
  critic_grads = critic * (2 if micro > 1 else 1)
  if cfg.moe_layers:
    warnings.append(f"{len(cfg.moe_layers)} MoE layers: activations counted as a dense MLP of "
                    f"width F={cfg.intermediate_size}; the dispatch's [T, E, F] ('dense'), "
                    "[T, E, C] ('capacity') or [~T k, F] ('sparse') tensors are not")
  if packed is None and rows % (mb * micro * batch_shards):
    warnings.append(f"P*G={rows} rows do not split into minibatches={mb} x micro_batches={micro}"
                    f" x {batch_shards} batch shards; rounded up")
  train_rows = (_split(rows, mb * micro * batch_shards) if packed is None
                else _split(packed[1], batch_shards))
  d, f, h, g, dh, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                       cfg.head_dim, cfg.num_layers)
  t_div = lambda n: n // tensor if n % tensor == 0 else n
  # On CPU micro-batches run side by side (one per thread): their activations live together.
  side_by_side = min(micro, update_lib.concurrent_chunks(config.model.parallel_chunks,
                                                         dev["kind"]))
  tokens = train_rows * side_by_side * seq_dev
  lin = (ACT_D * d + ACT_QKV * (t_div(h * dh) + 2 * t_div(g * dh)) + ACT_F * t_div(f)) * b
  if attention == "xla":
    attn = t_div(h) * seq_dev * (ATTN_BYTES + b)
  else:
    attn = t_div(h) * (dh * b + 4)
  block = attention_lib.balanced_block(seq_dev, blk)
  attn_blocks = (train_rows * side_by_side * t_div(h) * block ** 2 * 4 * BLOCK_TEMPS
                 if attention == "blockwise" else 0)
  layer_act = tokens * (lin + attn)
  reward = plan_rewards.plan_rewards(
      config, policy_cfg=cfg, mesh=mesh, rules=rules, rows=rows, batch_shards=batch_shards,
      prompt_len=prompt_len,
      forward_bytes=lambda c, n, width: forward_layer_bytes(c, n * width, width, attention,
                                                            tensor))
  tower = plan_vision.plan_tower(
      config, cfg, shapes, lambda name: rules_lib.per_device_bytes(shapes[name], p_sh[name]),
      prompt_len=prompt_len, prompts_dev=prompts_dev, train_rows=train_rows * side_by_side,
      forward_bytes=lambda dv, hv, dhv, fv, n, width: block_bytes(dv, hv, hv, dhv, fv, b, n,
                                                                  width, "xla"))
  dots = (t_div(h * dh) + 2 * t_div(g * dh) + d + 2 * t_div(f)) * b
  act_by_remat = layer_activations(L, tokens * d * b, tokens * dots, layer_act, cfg.scan_layers)
  act_by_remat = {k: v + attn_blocks for k, v in act_by_remat.items()}
  scan_weights = 0
  if cfg.scan_layers:  # the stacked layer weights and their stacked gradient, per device
    scan_weights = 2 * _layer_bytes(shapes, p_sh)
    if config.critic.enabled:
      scan_weights += 2 * _layer_bytes(c_shapes, c_sh)
  logits = train_rows * min(config.model.logits_chunk, seq_dev) * t_div(cfg.vocab_size) * 4 \
      * LOGITS_COPIES
  # One layer's weights as FSDP gathers them: expert kernels stay split over ``expert``.
  layers_w = _tree_bytes(shapes) - _tree_bytes({k: v for k, v in shapes.items()
                                                if not k.startswith("layers_")})
  layer_w = (layers_w - experts_w + experts_w // sizes["expert"]) // L // pb * b
  head_w = cfg.vocab_size * d * b
  train_gather = (GATHERED_LAYERS * layer_w + head_w) // tensor if zero3 > 1 else 0
  ring = ring_bytes(n_ctx, train_rows * side_by_side, seq_dev, t_div(g) * dh, b, L,
                    cfg.remat != "none")
  activations = act_by_remat[cfg.remat]

  tower_bytes = tower.bytes if tower else {}
  resident = params + opt + reference + critic + critic_opt + reward.resident
  rollout_peak = (kv_cache + kv_growth + prefill + rollout_gather + merged
                  + tower_bytes.get("tower_rollout", 0))
  train_peak = (grads + critic_grads + activations + logits + train_gather + scan_weights
                + ring["buffers"] + tower_bytes.get("tower_train", 0))
  if tower:
    assumptions += tower.assumptions
    warnings += tower.warnings
  peak = resident + max(rollout_peak, train_peak, reward.phase)
  usable = int(dev["bytes"] * USABLE_FRACTION)
  if optimizer is None and pb < 4:
    warnings.append(f"param_dtype={cfg.param_dtype} with optax's default state: AdamW moments and "
                    "updates are in the same 16-bit dtype, so steps much smaller than 2^-8 of a "
                    "weight round away; float32 params (or an optimizer with float32 state) "
                    "cost 2x params + 2x optimizer state")
  state_dtypes = sorted({str(x.dtype) for x in jax.tree.leaves(opt_shapes) if x.ndim})
  assumptions.insert(0, ("optimizer: clip + optax.adamw" if optimizer is None else
                         "optimizer: as given") + f", state arrays in {'/'.join(state_dtypes)} "
                     "(optax default: moments in the parameter dtype)"
                     + (", no float32 master copy" if pb < 4 else ""))
  assumptions.append(f"gradients in {cfg.param_dtype}" + (" (accumulator + micro-batch)"
                                                          if micro > 1 else ""))
  if cfg.lora_rank:
    assumptions.append(f"LoRA rank {cfg.lora_rank} on {'/'.join(cfg.lora_targets)}: the base "
                       f"({cfg.lora_base_dtype or cfg.param_dtype}) frozen, optimizer state and "
                       "gradients of the adapters only, no reference copy; the rollout holds the "
                       "merged kernels")
  return dict(
      model=dict(name=name, num_params=cfg.num_params(), layers=L, hidden=d, heads=h,
                 tower_params=tower.params if tower else 0,
                 tower_trainable=bool(tower and tower.trainable),
                 lora_rank=cfg.lora_rank, adapter_params=lora.count(adapter_shapes),
                 base_dtype=cfg.lora_base_dtype or cfg.param_dtype,
                 kv_heads=g, head_dim=dh, intermediate=f, vocab=cfg.vocab_size,
                 experts=cfg.num_experts, experts_per_token=cfg.experts_per_token,
                 moe_intermediate=cfg.moe_intermediate_size, moe_layers=len(cfg.moe_layers),
                 param_dtype=cfg.param_dtype, dtype=cfg.dtype, remat=cfg.remat,
                 scan_layers=cfg.scan_layers,
                 attention=attention),
      device=dict(name=device, kind=dev["kind"], count=count, hosts=dev["hosts"],
                  bytes=dev["bytes"], usable=usable),
      mesh=sizes, batch_shards=batch_shards,
      shapes=dict(rollout_rows=rows, rollout_rows_per_device=rows_dev, prompt_len=prompt_len,
                  cache_slots=cache_slots, kv_heads_per_device=g_dev, prompts_per_device=prompts_dev,
                  train_rows_per_device=train_rows, train_seq=slots,
                  train_seq_per_device=seq_dev, **(tower.shapes if tower else {})),
      bytes=dict(params=params, adapters=adapters, sampler_params=sampler_params,
                 merged_weights=merged, opt_state=opt, gradients=grads, reference=reference,
                 critic=critic, critic_opt_state=critic_opt, critic_gradients=critic_grads,
                 kv_cache=kv_cache, kv_cache_growth=kv_growth, prefill=prefill,
                 rollout_gathered_weights=rollout_gather, activations=activations,
                 activations_remat=act_by_remat["full"], activations_dots=act_by_remat["dots"],
                 activations_no_remat=act_by_remat["none"],
                 logits=logits, train_gathered_weights=train_gather,
                 scan_stacked_weights=scan_weights, ring_buffers=ring["buffers"],
                 ring_transfers=ring["sent"], **tower_bytes, **reward.bytes),
      resident=resident, rollout=rollout_peak, train=train_peak, reward=reward.phase,
      reward_models=reward.lines, peak=peak, fits=peak <= usable,
      fits_by_remat={k: resident + max(rollout_peak, train_peak - activations + v,
                                       reward.phase) <= usable
                     for k, v in act_by_remat.items()},
      fallbacks=fallbacks, assumptions=assumptions, warnings=warnings)

def _count(n: int) -> str:
  return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"

def _gib(x: int) -> str:
  return f"{x / GiB:8.2f}"

def format_plan(p: dict) -> str:
  """The printable report of ``plan``."""
  m, dev, s, by = p["model"], p["device"], p["shapes"], p["bytes"]
  mesh = p["mesh"]
  hosts = f", {dev['hosts']} host{'s' if dev['hosts'] != 1 else ''}" if dev["hosts"] else ""
  lines = [
      f"model   {m['name']}: {_count(m['num_params'])} params"
      + (f" + vision tower {_count(m['tower_params'])}" if m["tower_params"] else "")
      + f", L={m['layers']} D={m['hidden']}"
      f" H={m['heads']} G={m['kv_heads']} Dh={m['head_dim']} F={m['intermediate']} "
      f"V={m['vocab']}" + (f" E={m['experts']} k={m['experts_per_token']} "
                           f"Fe={m['moe_intermediate']} ({m['moe_layers']} MoE layers)"
                           if m["moe_layers"] else "")
      + f"; params {m['param_dtype']}, compute {m['dtype']}",
      f"device  {dev['name']}: {dev['count']} x {dev['kind']} ({dev['bytes'] / GiB:.1f} GiB "
      f"each{hosts})",
      "mesh    " + " ".join(f"{k}={mesh[k]}" for k in mesh_lib.AXES) + "; batch rows "
      + (f"split {p['batch_shards']} ways" if p["batch_shards"] > 1 else "not split"),
      "",
      f"per device                                                  GiB",
      (f"  params (base {m['base_dtype']}, adapters {m['param_dtype']})" if m["lora_rank"]
       else f"  params ({m['param_dtype']})").ljust(56) + _gib(by["params"]),
  ]
  if m["tower_params"]:
    lines += [f"    of which the vision tower ({_count(m['tower_params'])} params, "
              f"{'trained' if m['tower_trainable'] else 'frozen'})".ljust(56)
              + _gib(by["tower_params"])]
  if m["lora_rank"]:
    lines += [f"    of which LoRA adapters (rank {m['lora_rank']}, "
              f"{_count(m['adapter_params'])} params)".ljust(56) + _gib(by["adapters"])]
  lines += [
      "  optimizer state".ljust(56) + _gib(by["opt_state"]),
      "  reference model".ljust(56) + (
          _gib(by["reference"]) if by["reference"] else
          "       - (LoRA: the frozen base)" if m["lora_rank"] else
          "       - (algo.kl_placement='none')"),
  ]
  if by["critic"]:
    lines += ["  critic params".ljust(56) + _gib(by["critic"]),
              "  critic optimizer state".ljust(56) + _gib(by["critic_opt_state"])]
  else:
    lines.append("  critic".ljust(56) + "       - (critic.enabled=False)")
  if by.get("reward_model_params"):
    lines.append("  reward model params (reward.model.source)".ljust(56)
                 + _gib(by["reward_model_params"]))
  if by.get("judge_params"):
    lines.append("  judge params (reward.judge.source)".ljust(56) + _gib(by["judge_params"]))
  lines += [
      "  = resident".ljust(56) + _gib(p["resident"]),
      f"  rollout: kv cache [B={s['rollout_rows_per_device']}/{s['rollout_rows']}, "
      f"K={s['cache_slots']}, G={s['kv_heads_per_device']}]".ljust(56) + _gib(by["kv_cache"]),
      "  rollout: cache growth copy".ljust(56) + _gib(by["kv_cache_growth"]),
      f"  rollout: prefill scores [Pn={s['prompts_per_device']}, P={s['prompt_len']}]".ljust(56)
      + _gib(by["prefill"]),
      "  rollout: gathered weights".ljust(56) + _gib(by["rollout_gathered_weights"]),
  ] + ([
      f"  rollout: vision tower [Pn={s['prompts_per_device']}, "
      f"N={s['patches_per_prompt']} patches]".ljust(56) + _gib(by["tower_rollout"]),
  ] if by.get("tower_rollout") else []) + ([
      "  rollout: merged adapted kernels (LoRA)".ljust(56) + _gib(by["merged_weights"]),
  ] if m["lora_rank"] else []) + [
      "  = rollout phase".ljust(56) + _gib(p["rollout"]),
      "  train: gradients (+ critic)".ljust(56)
      + _gib(by["gradients"] + by["critic_gradients"]),
      (f"  train: activations, remat={m['remat']}, attention={m['attention']} "
       f"[rows={s['train_rows_per_device']}, S={s['train_seq']}"
       + (f"/{mesh['context']}" if mesh["context"] > 1 else "") + "]").ljust(56)
      + _gib(by["activations"]),
      f"         (remat none: {by['activations_no_remat'] / GiB:.2f} GiB, "
      f"dots: {by['activations_dots'] / GiB:.2f} GiB, full: {by['activations_remat'] / GiB:.2f}"
      " GiB)",
  ] + ([
      f"  train: vision tower ({'all' if m['tower_trainable'] else 'one'} of its blocks, "
      f"N={s['patches_per_prompt']} a row)".ljust(56) + _gib(by["tower_train"]),
  ] if by.get("tower_train") else []) + [
      "  train: log-prob chunk".ljust(56) + _gib(by["logits"]),
      "  train: stacked layer weights + gradient (scan_layers)".ljust(56)
      + (_gib(by["scan_stacked_weights"]) if m["scan_layers"]
         else "       - (model.scan_layers=False)"),
      "  train: gathered weights".ljust(56) + _gib(by["train_gathered_weights"]),
  ] + ([
      f"  train: ring buffers (context={mesh['context']})".ljust(56) + _gib(by["ring_buffers"]),
  ] if mesh["context"] > 1 else []) + [
      "  = train phase".ljust(56) + _gib(p["train"]),
  ] + ([
      "  reward: reward model forward".ljust(56) + _gib(by["reward_model_forward"]),
  ] if "reward_model_forward" in by else []) + ([
      "  reward: judge (kv cache or forward)".ljust(56) + _gib(by["judge_phase"]),
  ] if "judge_phase" in by else []) + ([
      "  = reward phase".ljust(56) + _gib(p["reward"]),
  ] if p["reward_models"] else []) + [
      "",
      f"peak = resident + max(rollout, train{', reward' if p['reward_models'] else ''}) = "
      f"{p['peak'] / GiB:.2f} GiB of "
      f"{dev['usable'] / GiB:.1f} GiB usable ({USABLE_FRACTION:.0%} of {dev['bytes'] / GiB:.1f})"
      f": {'FITS' if p['fits'] else 'DOES NOT FIT'}",
  ]
  if "sampler" in p:
    sp = p["sampler"]
    lines[-1] = (f"learner devices ({dev['count'] - sp['devices']} of {dev['count']}): peak = "
                 f"resident + train = {p['peak'] / GiB:.2f} GiB of {dev['usable'] / GiB:.1f} GiB "
                 f"usable: {'FITS' if p['peak'] <= dev['usable'] else 'DOES NOT FIT'}")
    lines += [f"sampler devices ({sp['devices']}, mesh.sampler_devices; data="
              f"{sp['mesh']['data']}): weights {sp['weights'] / GiB:.2f} + rollout "
              f"{sp['rollout'] / GiB:.2f} (kv cache {sp['kv_cache'] / GiB:.2f}) = "
              f"{sp['peak'] / GiB:.2f} GiB: {'FITS' if sp['fits'] else 'DOES NOT FIT'}"]
  elif "sampler_weights" in by:
    lines.insert(lines.index("  = resident".ljust(56) + _gib(p["resident"])),
                 "  sampler weight copies (rollout.max_staleness > 0)".ljust(56)
                 + _gib(by["sampler_weights"]))
  others = [k for k in REMAT_CHOICES if k != m["remat"] and p["fits_by_remat"][k] != p["fits"]]
  if others:
    lines.append(f"  (with model.remat in {others} it would "
                 f"{'not ' if p['fits'] else ''}fit)")
  if mesh["context"] > 1:
    lines.append(f"ring (context={mesh['context']}): each device sends "
                 f"{by['ring_transfers'] / GiB:.2f} GiB per micro-batch's forward + backward "
                 f"({by['ring_transfers'] / m['layers'] / 2 ** 20:.1f} MiB a layer)")
  lines.append("replicated fallbacks: " + ("none" if not p["fallbacks"] else ""))
  lines += [f"  {f}" for f in p["fallbacks"]]
  if p["warnings"]:
    lines.append("warnings:")
    lines += [f"  {w}" for w in p["warnings"]]
  lines.append("assumptions:")
  lines += [f"  {a}" for a in p["assumptions"] + p["reward_models"]]
  return "\n".join(lines)

def plan_main(config, device: str | None = None, *, model: str | None = None,
              prompt_len: int | None = None) -> str:
  """``rljax plan --config X [--device D] [--model NAME] [--prompt-len N]``: the report.

  ``device=None`` takes ``plan.device`` from the config (the configs/jobs/qwen7b_*.py files set it).
  """
  return format_plan(plan(config, device, model=model, prompt_len=prompt_len))

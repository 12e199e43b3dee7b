"""rljax at real model sizes on one accelerator: the GRPO update's MFU, the sampler's HBM roofline.

  python benchmarks/accelerator.py [--models qwen2.5-0.5b,qwen2.5-1.5b] [--settings 8x2048,2x8192]
                                   [--sampler-rows 64,256] [--peak-tflops 989] [--hbm-gbps auto]
                                   [--compilation-cache DIR] [--profile DIR]
  python benchmarks/accelerator.py --smoke        # a tiny model on the CPU, in seconds (the test)

Models: random weights in the shapes of ``rljax.plan.MODEL_SHAPES`` (Qwen2.5-0.5B and
-1.5B: tied embeddings, vocabulary 151936), created on the device. Precision: the project's policy,
``model.dtype='auto'`` (bfloat16 compute on accelerators, float32 on CPU) with float32 parameters
and optimizer state; the sampler computes in the model's dtype (``rollout.dtype`` unset).

**Update** (``RxS``: R rows of S tokens, the first ``--update-prompt`` (256) of them prompt, the
other T completion): ``configs/algos/grpo.py`` (clipped ratio, k3 KL to the reference in the loss,
one optimizer step per batch, so the loss's forward also gives the old log-probs) built by
``rljax.train.build.sharded_state_and_fns``, the batch scored once by ``fns.score``, then
``fns.train_step`` (forward, log-probs at the completion positions only, backward, clipping,
AdamW) timed: the median of ``--steps`` steps after the first, whose extra time is printed as the
compile time. ``model.remat``: ``--remat``, by default the cheapest one ``rljax plan`` says fits
the device's memory (none, dots, full).

Model FLOPs of one update (MFU counts these; rematerialisation's recomputation is not counted)::

  3 x forward,  forward = 2 N R S                      weight matmuls (N: parameters outside the
                                                       embedding table; norms and biases included)
                        + 2 D V R T                    LM head, at the completion positions only
                        + 4 L H Dh R S (S + 1) / 2     causal attention, q.k and p.v

  MFU = model FLOPs / step seconds / --peak-tflops  (989: H100 SXM bf16 dense)

**Sampler** (``BxP+T``: B prompts of P tokens, T new tokens forced, no stop ids):
``rljax.rollout.make_sampler`` (``rljax.rollout.sample`` with its static arguments bound), the
median of ``--runs`` calls after the first (compile). ``ms`` is the call's time / T, so one
prefill is included. HBM roofline of one decode step::

  bytes = W b + 2 L G Dh B (P + T/2) b     the weights the step reads (all parameters with
                                           tied embeddings, the LM head being the table; untied:
                                           less the input table) + the KV cache at its mean
                                           filled length; b bytes per element of the sampler's
                                           dtype
  fraction = bytes / (ms per step) / --hbm-gbps  (auto: 3350 on an H100 SXM, 4800 on an H200)

**Peer** (update only, where torch has CUDA; ``benchmarks/torch_peer.py``): ``transformers`` with
SDPA attention, float32 parameters under bfloat16 autocast, the same loss and optimizer. It runs
first, before JAX holds any device memory: JAX keeps its memory pool (75% of the device by
default) for the life of the process, so the other order would leave torch a quarter of it.

Memory: ``XLA GiB`` is the compiled program's own figure (arguments + outputs + temporaries -
donated), ``peak GiB`` the process's peak so far (``memory_stats``; JAX cannot reset it, so a row
shows the largest of itself and the rows above it).
"""
import argparse
import dataclasses
import gc
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rljax.config import loader as config_loader  # noqa: E402
from rljax.algorithm import resolve  # noqa: E402
from rljax.models import transformer  # noqa: E402
from rljax.parallel import mesh as mesh_lib  # noqa: E402
from rljax import plan as plan_lib  # noqa: E402
from rljax.rollout import Rollout, SamplingParams, make_sampler  # noqa: E402
from rljax.train import build  # noqa: E402
from rljax.runs import compilation_cache
import profile_summary  # noqa: E402
import torch_peer as torch_peer_lib  # noqa: E402
from bench_common import timed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 2 ** 30
MAX_POSITIONS = 32768  # Qwen2.5's context (MODEL_SHAPES leaves the 4096 default); not allocated
SMOKE_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16)
SMOKE_ARGS = dict(models="qwen2.5-0.5b", settings="2x128", update_prompt=32, sampler_rows="8",
                  prompt_len=16, new_tokens=16, steps=2, runs=2)
# HBM bandwidth by device name (the first that the device kind contains): SXM figures.
HBM_GBPS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0}
REMATS = ("none", "dots", "full")  # less memory, more recomputation
COLUMNS = ("model", "measure", "shape", "ms", "compile s", "throughput", "% roofline",
           "XLA GiB", "peak GiB", "notes", "torch+SDPA ms", "torch / rljax")


@dataclasses.dataclass
class Row:
  model: str
  measure: str  # 'update' | 'sample'
  shape: str
  ms: float  # update: one step; sample: one decode step
  compile_s: float
  throughput: str
  roofline: float  # MFU or fraction of the HBM roofline
  xla_bytes: int | None
  peak_bytes: int | None
  notes: str
  peer: dict | None = None  # {'ms', 'note'} of the torch peer

  def cells(self) -> list[str]:
    peer_ms = f"{self.peer['ms']:.1f}" if self.peer and self.peer.get("ms") else "-"
    ratio = f"{self.peer['ms'] / self.ms:.2f}x" if self.peer and self.peer.get("ms") else "-"
    notes = self.notes + (f"; torch: {self.peer['note']}" if self.peer else "")
    return [self.model, self.measure, self.shape, f"{self.ms:.2f}", f"{self.compile_s:.1f}",
            self.throughput, f"{100 * self.roofline:.3g}%", _gib(self.xla_bytes),
            _gib(self.peak_bytes), notes, peer_ms, ratio]


def _gib(n) -> str:
  return "n/a" if n is None else f"{n / GiB:.3g}"


def _flops(per_second: float) -> str:
  if per_second >= 1e12:
    return f"{per_second / 1e12:.1f} TFLOP/s"
  return f"{per_second / 1e9:.3g} GFLOP/s"


def print_cells(cells) -> None:
  print("| " + " | ".join(cells) + " |", flush=True)


# --- shapes and counts ---------------------------------------------------------------------------

def parse_settings(text: str) -> list[tuple[int, int]]:
  """``"8x2048,2x8192"`` -> ``[(8, 2048), (2, 8192)]`` (rows, tokens per row)."""
  out = []
  for item in text.split(","):
    rows, seq = item.lower().split("x")
    out.append((int(rows), int(seq)))
  return out


def update_config(rows: int, seq: int, prompt: int, remat: str | None = None, dtype="auto"):
  """``configs/algos/grpo.py`` for one group of ``rows`` completions of ``seq - prompt`` tokens."""
  overrides = [("rollout.prompts_per_step", "1"), ("rollout.group_size", str(rows)),
               ("rollout.max_new_tokens", str(seq - prompt)), ("data.prompt_bucket", str(prompt)),
               ("model.dtype", dtype)]
  if remat is not None:
    overrides.append(("model.remat", remat))
  return config_loader.load_config(os.path.join(ROOT, "configs", "algos", "grpo.py"), overrides)


def model_config(config, name: str, platform: str, smoke: bool):
  """The architecture ``name`` of ``MODEL_SHAPES`` with the config's dtypes and remat on
  ``platform``; ``smoke``: the same family at ``SMOKE_SHAPE``."""
  _, cfg = plan_lib.model_config(config, name, platform)
  return cfg.replace(max_position_embeddings=MAX_POSITIONS, **(SMOKE_SHAPE if smoke else {}))


def label(args, name: str) -> str:
  return f"{name} at the smoke shape" if args.smoke else name


def non_embedding_params(cfg) -> int:
  table = cfg.vocab_size * cfg.hidden_size
  return cfg.num_params() - table * (1 if cfg.tie_embeddings else 2)


def update_flops(cfg, rows: int, seq: int, completion: int) -> float:
  """Model FLOPs of one update (the module docstring's formula)."""
  attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * rows * seq * (seq + 1) / 2
  forward = (2 * non_embedding_params(cfg) * rows * seq
             + 2 * cfg.hidden_size * cfg.vocab_size * rows * completion + attention)
  return 3 * forward


def decode_step_bytes(cfg, rows: int, prompt: int, new_tokens: int) -> float:
  """HBM bytes one decode step reads at least (the module docstring's formula)."""
  b = np.dtype(cfg.dtype).itemsize
  weights = cfg.num_params() - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size)
  kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * rows * (prompt + new_tokens / 2)
  return (weights + kv) * b


# --- device --------------------------------------------------------------------------------------

def hbm_gbps(args) -> float:
  if args.hbm_gbps != "auto":
    return float(args.hbm_gbps)
  kind = jax.devices()[0].device_kind
  return next((v for k, v in HBM_GBPS.items() if k in kind), HBM_GBPS["H100"])


def memory_stats() -> dict:
  return jax.devices()[0].memory_stats() or {}


def program_bytes(compiled) -> int | None:
  """Arguments + outputs + temporaries - donated, of a compiled program (None: not reported)."""
  m = compiled.memory_analysis()
  if m is None:
    return None
  return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
          - m.alias_size_in_bytes)


def choose_remat(args, name: str, rows: int, seq: int) -> tuple[str, str]:
  """(model.remat, why): ``--remat`` when given; else the first of none / dots / full that
  ``rljax plan`` fits into this device's memory limit (the config's default in smoke runs)."""
  if args.remat != "auto":
    return args.remat, "--remat"
  if args.smoke:
    return "none", "smoke"
  limit = memory_stats().get("bytes_limit")
  device = f"1x{limit}" if limit else "1xcpu"
  for remat in REMATS:
    config = update_config(rows, seq, args.update_prompt, remat, args.dtype)
    report = plan_lib.plan(config, device, model=name, prompt_len=args.update_prompt)
    if report["fits"] or remat == "full":
      return remat, (f"plan: {_gib(report['peak'])} of {_gib(report['device']['usable'])} GiB"
                     + ("" if report["fits"] else ", does not fit"))


# --- rljax ---------------------------------------------------------------------------------------

def synthetic_rollout(cfg, rows: int, prompt: int, completion: int) -> Rollout:
  """Full-length rows of random tokens (no stop token), rewards alternating 0 / 1 so the group's
  advantages are not all zero."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, cfg.vocab_size, (rows, prompt + completion)).astype(np.int32)
  rewards = (np.arange(rows) % 2).astype(np.float32)
  ones = np.ones((rows, completion), np.int32)
  zeros = np.zeros((rows, completion), np.float32)
  return Rollout(prompt_tokens=tokens[:, :prompt], prompt_mask=np.ones((rows, prompt), np.int32),
                 tokens=tokens[:, prompt:], mask=ones, sampler_logp=zeros, draw_logp=zeros,
                 lengths=np.full(rows, completion, np.int32), truncated=np.ones(rows, bool),
                 rewards=rewards, correct=rewards > 0, row_valid=np.ones(rows, np.float32))


def profiled(args, tag: str, fn, per: int = 1) -> None:
  """With ``--profile DIR``: one more call of ``fn`` under ``jax.profiler.trace(DIR/tag)``, and
  the trace's kernels summed by name printed (``profile_summary``; the trace stays in DIR)."""
  if not args.profile:
    return
  where = os.path.join(args.profile, tag)
  with jax.profiler.trace(where, create_perfetto_trace=True):
    fn()
  print(profile_summary.summary(where, calls=1, per=per, top=30), flush=True)


def measure_update(args, name: str, rows: int, seq: int, platform: str, remat: str,
                   why: str) -> Row:
  config = update_config(rows, seq, args.update_prompt, remat, args.dtype)
  cfg = model_config(config, name, platform, args.smoke)
  completion = seq - args.update_prompt
  state, fns, _ = build.sharded_state_and_fns(
      config, cfg, transformer.init_params(cfg, seed=0), mesh_lib.make_mesh(config.mesh))
  hp = resolve(config).hparams
  batch, _ = fns.score(state, synthetic_rollout(cfg, rows, args.update_prompt, completion), hp)
  holder = {"state": state}
  del state

  def step():
    holder["state"], metrics = fns.train_step(holder["state"], batch, hp)
    jax.block_until_ready((holder["state"], metrics))

  first, times = timed(step, args.steps)
  step_s = statistics.median(times)
  profiled(args, f"{name}_update_{rows}x{seq}", step)
  xla = program_bytes(fns.train_step.lower(holder["state"], batch, hp).compile())
  flops = update_flops(cfg, rows, seq, completion)
  return Row(model=label(args, name), measure="update", shape=f"{rows}x{seq}", ms=1e3 * step_s,
             compile_s=first - step_s, throughput=_flops(flops / step_s),
             roofline=flops / step_s / (args.peak_tflops * 1e12), xla_bytes=xla,
             peak_bytes=memory_stats().get("peak_bytes_in_use"),
             notes=f"remat {remat} ({why}), {cfg.dtype} compute, prompt {args.update_prompt}")


def is_out_of_memory(error: Exception) -> bool:
  return "RESOURCE_EXHAUSTED" in str(error) or "out of memory" in str(error).lower()


def update_or_none(args, name: str, rows: int, seq: int, platform: str, remat: str,
                   why: str) -> Row | None:
  """``measure_update``, None where XLA runs out of memory (returning drops the traceback, and
  with it the arrays its frames hold)."""
  try:
    return measure_update(args, name, rows, seq, platform, remat, why)
  except Exception as e:  # noqa: BLE001 - only XLA's out-of-memory error is expected
    if not is_out_of_memory(e):
      raise
    first_line = (str(e).splitlines() or [""])[0][:160]
    print(f"# {name} {rows}x{seq}, remat {remat}: out of memory ({first_line})")
    return None


def measure_update_fitting(args, name: str, rows: int, seq: int, platform: str) -> Row:
  """The update at the remat ``choose_remat`` picks, then at the next ones while it does not
  fit (the plan is an estimate)."""
  remat, why = choose_remat(args, name, rows, seq)
  for candidate in REMATS[REMATS.index(remat):]:
    row = update_or_none(args, name, rows, seq, platform, candidate, why)
    gc.collect()
    if row is not None:
      return row
    why = f"{candidate} ran out of memory"
  return Row(model=label(args, name), measure="update", shape=f"{rows}x{seq}",
             ms=float("nan"), compile_s=float("nan"), throughput="-", roofline=float("nan"),
             xla_bytes=None, peak_bytes=None, notes="out of memory with every remat")


def measure_sampler(args, name: str, rows: int, platform: str) -> Row:
  # The run's config only for the dtypes: model.dtype and rollout.dtype.
  config = update_config(2, args.prompt_len + args.new_tokens, args.prompt_len, None, args.dtype)
  cfg = model_config(config, name, platform, args.smoke)
  sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, greedy=False,
                      max_new_tokens=args.new_tokens, stop_ids=(), pad_id=0)
  sampler = make_sampler(cfg, sp, 1, dtype=config.rollout.dtype)
  params = transformer.init_params(cfg, seed=0)
  prompts = np.random.default_rng(0).integers(3, cfg.vocab_size, (rows, args.prompt_len))
  prompts = prompts.astype(np.int32)
  mask = np.ones_like(prompts)
  calls = iter(range(10 ** 6))

  def call():
    jax.block_until_ready(sampler(params, prompts, mask, jax.random.key(next(calls))).tokens)

  first, times = timed(call, args.runs)
  call_s = statistics.median(times)
  profiled(args, f"{name}_sample_{rows}", call, per=args.new_tokens)
  step_s = call_s / args.new_tokens
  xla = program_bytes(sampler.lower(params, prompts, mask, jax.random.key(0)).compile())
  hbm = decode_step_bytes(cfg, rows, args.prompt_len, args.new_tokens) / step_s
  return Row(model=label(args, name), measure="sample",
             shape=f"{rows}x{args.prompt_len}+{args.new_tokens}", ms=1e3 * step_s,
             compile_s=first - call_s,
             throughput=f"{rows * args.new_tokens / call_s:,.0f} tok/s",
             roofline=hbm / (hbm_gbps(args) * 1e9), xla_bytes=xla,
             peak_bytes=memory_stats().get("peak_bytes_in_use"),
             notes=f"{cfg.dtype} weights and KV cache")


# --- the torch peer (benchmarks/torch_peer.py) ---------------------------------------------------

def torch_peer(args, names, settings) -> dict:
  """{(model, rows, seq): {'ms', 'note'}}, measured before JAX allocates any device memory."""
  missing = None if args.smoke else torch_peer_lib.missing()
  if args.no_peer or args.smoke or missing:
    reason = "--no-peer" if args.no_peer else "--smoke" if args.smoke else missing
    print(f"# torch peer skipped: {reason}")
    return {}
  import torch
  import transformers
  print(f"# torch peer: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.cuda.get_device_name(0)}; measured first (see the docstring)")
  out = {}
  for name in names:
    config = update_config(*settings[0], args.update_prompt, "none", args.dtype)
    cfg = model_config(config, name, "gpu", False)
    for rows, seq in settings:
      out[name, rows, seq] = torch_peer_lib.measure(cfg, rows, seq, seq - args.update_prompt,
                                                    args.steps)
      print(f"# torch {name} {rows}x{seq}: {out[name, rows, seq]}", flush=True)
  return out


# --- main ----------------------------------------------------------------------------------------

def print_header(args) -> None:
  import flax
  import jaxlib
  device = jax.devices()[0]
  versions = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}"
  print(f"# {device.platform}: {device.device_kind} x{jax.device_count()}, {versions}; "
        f"peak {args.peak_tflops:g} TFLOP/s, HBM {hbm_gbps(args):g} GB/s (--peak-tflops, "
        f"--hbm-gbps)")
  print("# MFU = 3 (2 N R S + 2 D V R T + 4 L H Dh R S(S+1)/2) / step s / peak (N: parameters "
        "outside the embedding table, T: completion tokens)")
  print("# HBM % = (W b + 2 L G Dh B (P + T/2) b) / (ms per decode step) / HBM GB/s (W: weights "
        "read, b: bytes per element); ms per decode step = call / T, prefill included")
  print_cells(COLUMNS)
  print_cells(["---"] * len(COLUMNS))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b",
                 help=f"comma list of {sorted(plan_lib.MODEL_SHAPES)}")
  p.add_argument("--settings", default="8x2048,2x8192", help="update shapes, ROWSxTOKENS")
  p.add_argument("--update-prompt", type=int, default=256, help="prompt tokens of each update row")
  p.add_argument("--sampler-rows", default="64,256", help="comma list; '' for no sampler")
  p.add_argument("--prompt-len", type=int, default=128, help="sampler prompt tokens")
  p.add_argument("--new-tokens", type=int, default=512, help="sampler tokens per row, forced")
  p.add_argument("--steps", type=int, default=5, help="timed update steps after the first")
  p.add_argument("--runs", type=int, default=3, help="timed sampler calls after the first")
  p.add_argument("--remat", default="auto", choices=("auto", "none", "dots", "full"))
  p.add_argument("--dtype", default="auto", help="model.dtype")
  p.add_argument("--peak-tflops", type=float, default=989.0, help="H100 SXM bf16 dense")
  p.add_argument("--hbm-gbps", default="auto",
                 help=f"GB/s; auto: by the device's name {HBM_GBPS}, else {HBM_GBPS['H100']}")
  p.add_argument("--compilation-cache", default=None, metavar="DIR",
                 help="read and write compiled programs there (train.compilation_cache's way): "
                      "a second run's compile times are then those of a warm cache")
  p.add_argument("--no-peer", action="store_true", help="skip the torch peer")
  p.add_argument("--profile", default=None, metavar="DIR",
                 help="after each row's timing, trace one more step / call into DIR and print "
                      "its kernels summed by name (benchmarks/profile_summary.py)")
  p.add_argument("--smoke", action="store_true",
                 help=f"a tiny model ({SMOKE_SHAPE}) and shapes ({SMOKE_ARGS}), on any backend")
  args = p.parse_args(argv)
  if args.smoke:
    for key, value in SMOKE_ARGS.items():
      if getattr(args, key) == p.get_default(key):
        setattr(args, key, value)
  return args


def measure_model(args, name: str, settings, sampler_rows, peer: dict) -> list[Row]:
  """Every row of one model, each printed as soon as it is measured."""
  platform, rows = jax.default_backend(), []
  for r, s in settings:
    rows.append(measure_update_fitting(args, name, r, s, platform))
    rows[-1].peer = peer.get((name, r, s))
    print_cells(rows[-1].cells())
  for b in sampler_rows:
    rows.append(measure_sampler(args, name, b, platform))
    print_cells(rows[-1].cells())
    gc.collect()
  return rows


def main(argv=None) -> list[Row]:
  args = parse_args(argv)
  names = [n for n in args.models.split(",") if n]
  settings = parse_settings(args.settings) if args.settings else []
  sampler_rows = [int(n) for n in args.sampler_rows.split(",") if n]
  peer = torch_peer(args, names, settings) if settings else {}
  with compilation_cache.persistent(args.compilation_cache) as cache:
    if cache:
      found = len(os.listdir(cache)) if os.path.isdir(cache) else 0
      print(f"# compilation cache {cache}: {found} entries at the start")
    print_header(args)
    return [row for name in names
            for row in measure_model(args, name, settings, sampler_rows, peer)]


if __name__ == "__main__":
  main()

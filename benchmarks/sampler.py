"""Sampler throughput: rljax's jitted KV-cache sampler against ``transformers`` ``generate``.

Both run in this one process on the CPU, on the same weights (rljax's random init exported with
``save_hf`` and loaded by ``transformers``), with plain sampling (temperature 1, ``top_k=0``, top-p
off), prompts of 32 tokens and exactly 64 new tokens forced on both sides (no stop token).

For each model and batch size it prints tokens/s (generated tokens / wall time of the whole call,
prefill included; median of ``--runs`` timed runs after a warm-up, with min-max), the ratio
rljax / transformers, rljax's compile time (reported separately, never in the throughput), peak
memory, and the fraction of the machine's compute ceiling reached:

  ceiling [tokens/s] = matmul FLOP/s / FLOPs per generated token

- matmul FLOP/s: the best of a 2048x2048 float32 matmul measured in this run with XLA and with
  torch (the higher of the two);
- FLOPs per generated token: the useful model FLOPs of the call (prefill of the prompt, one
  forward per generated token but the last, causal attention over the filled context only, the
  output head only where a token is sampled) divided by the number of generated tokens.

Peak memory: ``rss`` is the growth of the process's resident memory during a call (polled every
0.2 ms, in the warm-up call and one more untimed call, the larger of the two; glibc is told to
return buffers of 64 KiB or more to the OS on free, so the growth is the peak of what the call
itself held), for both frameworks; ``xla`` is XLA's own accounting of the compiled sampler per
device (arguments + outputs + temporaries: weights, KV cache, buffers).

No XLA flag is set. Usage::

  python benchmarks/sampler.py                       # both models, batch 8, 64, 256
  python benchmarks/sampler.py --models 1M --batches 64 --runs 3
  python benchmarks/sampler.py --backend gpu --batches 8,64,256,1024

On a GPU (``--backend gpu``, or ``auto`` when JAX's default backend is the GPU) rljax runs on one
GPU (no host devices are forced) and transformers on torch CUDA, each call synchronised before the
clock stops; the matmul of the ceiling is 8192^3 float32 on the GPU with both frameworks (each at
its default precision, printed: XLA may use TF32 for float32 dots, torch does not unless
``allow_tf32`` is set); memory is device memory: XLA's accounting of the compiled sampler, JAX's
peak bytes in use over the process so far, and torch's peak allocated bytes during the first call
(weights included).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="1M,6M")
  ap.add_argument("--batches", default="8,64,256")
  ap.add_argument("--runs", type=int, default=5, help="timed runs per side (after a warm-up)")
  ap.add_argument("--devices", type=int, default=os.cpu_count(),
                  help="CPU devices for the rljax sampler (default: one per core)")
  ap.add_argument("--no-hf", action="store_true", help="rljax only")
  ap.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto",
                  help="auto: JAX's default backend; gpu: rljax on one GPU, transformers on CUDA")
  return ap.parse_args(argv)


def _unpooled_malloc():
  """Make glibc return every buffer of 64 KiB or more to the OS when it is freed (fixed mmap
  threshold), so that the resident-set growth during a call is the peak of what the call held."""
  try:
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD (a fixed value also stops its auto-tuning)
    libc.mallopt(-1, 64 << 10)  # M_TRIM_THRESHOLD
  except OSError:
    pass


if __name__ == "__main__":
  ARGS = _parse()
  if ARGS.backend == "cpu":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if ARGS.backend != "gpu":  # host memory is what is measured on the CPU
    _unpooled_malloc()
  if ARGS.backend != "gpu" and ARGS.devices > 1:  # before JAX initialises its CPU backend
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={ARGS.devices}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from rljax.models import ModelConfig, transformer, save_hf# noqa: E402
from rljax.rollout import SamplingParams, make_sampler, sampler  # noqa: E402
import bench_common  # noqa: E402
from bench_common import matmul_flops, matmul_precisions  # noqa: E402

PROMPT, NEW, VOCAB = 32, 64, 64


def model_config(name: str) -> ModelConfig:
  return bench_common.model_config(name, VOCAB, max_positions=256)


def flops_per_generated_token(cfg: ModelConfig, p: int = PROMPT, t: int = NEW) -> float:
  """Useful FLOPs of one row's generate call (prefill + t-1 decode steps) / t."""
  d, f, h, g, dh = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                    cfg.head_dim)
  per_position = 2 * cfg.num_layers * (d * (h + 2 * g) * dh + h * dh * d + 3 * d * f)
  attn_per_key = 4 * cfg.num_layers * h * dh  # q.k and p.v
  head = 2 * d * cfg.vocab_size
  prefill = p * per_position + attn_per_key * p * (p + 1) / 2 + head
  decode = sum(per_position + attn_per_key * (p + s) + head for s in range(1, t))
  return (prefill + decode) / t


def _timed(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def _rss() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_growth(fn) -> int:
  """Peak growth of the resident set while ``fn`` runs (polled every 0.2 ms)."""
  base, peak, stop = _rss(), [0], threading.Event()

  def poll():
    while not stop.is_set():
      peak[0] = max(peak[0], _rss())
      time.sleep(0.0002)

  th = threading.Thread(target=poll)
  th.start()
  try:
    fn()
  finally:
    stop.set()
    th.join()
  return max(0, max(peak[0], _rss()) - base)


class Rljax:

  def __init__(self, cfg, params, batch, devices=1, device=None):
    self.sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW,
                             stop_ids=())
    self.params = params
    rng = np.random.default_rng(batch)
    self.tokens = rng.integers(0, VOCAB, (batch, PROMPT)).astype(np.int32)
    self.mask = np.ones_like(self.tokens)
    if device is not None:  # everything on the accelerator before the clock starts
      self.params, self.tokens, self.mask = jax.device_put((params, self.tokens, self.mask),
                                                           device)
    if devices > 1:
      mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
      jitted = make_sampler(cfg, self.sp, 1, mesh=mesh).jitted
      lowered = jitted.lower(params, self.tokens, self.mask, jax.random.key(0))
    else:
      lowered = sampler._sample_jit.lower(self.params, self.tokens, self.mask,
                                          jax.random.key(0), cfg=cfg, sp=self.sp, group_size=1)
    t0 = time.perf_counter()
    self.compiled = lowered.compile()
    self.compile_s = time.perf_counter() - t0
    mem = self.compiled.memory_analysis()
    self.xla_bytes = None if mem is None else (mem.argument_size_in_bytes +
                                               mem.output_size_in_bytes + mem.temp_size_in_bytes)
    self.calls = 0

  def __call__(self):
    self.calls += 1
    r = self.compiled(self.params, self.tokens, self.mask, jax.random.key(self.calls))
    jax.block_until_ready(r)
    assert r.tokens.shape == (self.tokens.shape[0], NEW)


class HF:

  def __init__(self, path, batch, device="cpu"):
    import torch
    import transformers
    self.torch = torch
    self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    self.model.to(device)
    self.model.eval()
    rng = np.random.default_rng(batch)
    self.tokens = torch.tensor(rng.integers(0, VOCAB, (batch, PROMPT)), dtype=torch.long,
                               device=device)
    self.mask = torch.ones_like(self.tokens)
    self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

  def __call__(self):
    with self.torch.inference_mode():
      out = self.model.generate(input_ids=self.tokens, attention_mask=self.mask, do_sample=True,
                                temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW,
                                min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    self.sync()  # inside the timed call: CUDA kernels run asynchronously
    assert out.shape == (self.tokens.shape[0], PROMPT + NEW), out.shape


def _stats(times, batch):
  tps = sorted(batch * NEW / t for t in times)
  return statistics.median(tps), tps[0], tps[-1]


def _print_header(runs: int, memory_columns: str):
  print(f"# prompt {PROMPT} tokens, {NEW} new tokens forced, vocab {VOCAB}; tokens/s = median "
        f"[min-max] of {runs} runs")
  header = ("| model | params | batch | rljax tok/s | transformers tok/s | ratio | % ceiling | "
            f"rljax compile s | {memory_columns} |")
  print(header)
  print("|---" * (header.count("|") - 1) + "|")


def _interleaved(ours, theirs, runs: int):
  """Call times of both sides, alternated run by run so that both see the same machine load."""
  t_ours, t_theirs = [], []
  for _ in range(runs):
    t_ours.append(_timed(ours))
    if theirs is not None:
      t_theirs.append(_timed(theirs))
  return t_ours, t_theirs


def _xla_mb(ours) -> float:
  return float("nan") if ours.xla_bytes is None else ours.xla_bytes / 2 ** 20


def _print_row(name, cfg, batch, t_ours, t_theirs, ceiling, ours, ours_mem: str, hf_mb,
               pct_digits: int):
  """One table row: tokens/s of both sides (median [min-max]), ratio, % ceiling, memory."""
  o_med, o_lo, o_hi = _stats(t_ours, batch)
  hf_col, ratio, hf_mem = "-", "-", "-"
  if t_theirs:
    h_med, h_lo, h_hi = _stats(t_theirs, batch)
    hf_col = f"{h_med:,.0f} [{h_lo:,.0f}-{h_hi:,.0f}]"
    ratio = f"{o_med / h_med:.2f}x"
    hf_mem = f"{hf_mb:.1f}"
  print(f"| {name} | {cfg.num_params() / 1e6:.2f}M | {batch} | "
        f"{o_med:,.0f} [{o_lo:,.0f}-{o_hi:,.0f}] | {hf_col} | {ratio} | "
        f"{100 * o_med / ceiling:.{pct_digits}f}% | {ours.compile_s:.1f} | "
        f"{ours_mem} | {hf_mem} |", flush=True)


def main(args):
  if args.backend == "gpu" and jax.default_backend() != "gpu":
    raise SystemExit(f"--backend gpu: JAX's default backend is {jax.default_backend()!r} "
                     f"({jax.devices()})")
  if jax.default_backend() == "gpu":
    return main_gpu(args)
  import torch
  import transformers

  flops = matmul_flops()
  peak = max(flops.values())
  print(f"# machine: {os.cpu_count()} CPU cores; rljax on {args.devices} CPU device(s); "
        f"jax {jax.__version__} ({jax.default_backend()}), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}")
  print(f"# float32 2048^3 matmul: XLA {flops['xla'] / 1e9:.0f} GFLOP/s, torch "
        f"{flops['torch'] / 1e9:.0f} GFLOP/s -> ceiling uses {peak / 1e9:.0f} GFLOP/s")
  _print_header(args.runs, "rljax peak MB rss (xla/device) | transformers peak MB rss")
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.models.split(","):
      cfg = model_config(name)
      params = transformer.init_params(cfg, seed=0)
      path = os.path.join(tmp, name)
      save_hf(path, cfg, params)
      ceiling = peak / flops_per_generated_token(cfg)
      for batch in [int(b) for b in args.batches.split(",")]:
        ours = Rljax(cfg, params, batch, args.devices)
        rss_ours = peak_rss_growth(ours)  # the warm-up call
        theirs = None if args.no_hf else HF(path, batch)
        if theirs is not None:
          rss_theirs = peak_rss_growth(theirs)
        t_ours, t_theirs = _interleaved(ours, theirs, args.runs)
        rss_ours = max(rss_ours, peak_rss_growth(ours)) / 2 ** 20
        hf_mem = None
        if theirs is not None:
          hf_mem = max(rss_theirs, peak_rss_growth(theirs)) / 2 ** 20
        _print_row(name, cfg, batch, t_ours, t_theirs, ceiling, ours,
                   f"{rss_ours:.1f} ({_xla_mb(ours):.1f})", hf_mem, pct_digits=0)


def _jax_peak_mb(device) -> float:
  """JAX's peak device bytes in use over the process so far (nan where not reported)."""
  stats = device.memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return float("nan") if peak is None else peak / 2 ** 20


def main_gpu(args):
  """The same table on one GPU: rljax on JAX's first GPU, transformers on torch CUDA."""
  import gc

  import torch
  import transformers

  if not torch.cuda.is_available():
    raise SystemExit("JAX sees a GPU but torch.cuda does not: the peer would run on the CPU")
  device = jax.devices()[0]
  n = 8192
  flops = matmul_flops(n, gpu=True)
  peak = max(flops.values())
  print(f"# machine: {device.device_kind} (torch: {torch.cuda.get_device_name(0)}); rljax on 1 "
        f"GPU; jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), transformers {transformers.__version__}")
  print(f"# matmul precision: {matmul_precisions(torch)}")
  print(f"# float32 {n}^3 matmul: XLA {flops['xla'] / 1e12:.1f} TFLOP/s, torch "
        f"{flops['torch'] / 1e12:.1f} TFLOP/s -> ceiling uses {peak / 1e12:.1f} TFLOP/s")
  _print_header(args.runs, "rljax MB xla (jax peak so far) | transformers peak MB cuda")
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.models.split(","):
      cfg = model_config(name)
      params = jax.device_put(transformer.init_params(cfg, seed=0), device)
      path = os.path.join(tmp, name)
      save_hf(path, cfg, jax.device_get(params))
      ceiling = peak / flops_per_generated_token(cfg)
      for batch in [int(b) for b in args.batches.split(",")]:
        ours = Rljax(cfg, params, batch, 1, device)
        ours()  # warm-up
        theirs = None
        gc.collect()  # the previous peer's weights leave the device before this one is counted
        if not args.no_hf:
          torch.cuda.synchronize()
          base = torch.cuda.memory_allocated()
          torch.cuda.reset_peak_memory_stats()
          theirs = HF(path, batch, "cuda")
          theirs()  # warm-up
          cuda_mb = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        t_ours, t_theirs = _interleaved(ours, theirs, args.runs)
        _print_row(name, cfg, batch, t_ours, t_theirs, ceiling, ours,
                   f"{_xla_mb(ours):.1f} ({_jax_peak_mb(device):.1f})",
                   None if theirs is None else cuda_mb, pct_digits=1)
        del ours


if __name__ == "__main__":
  main(ARGS)

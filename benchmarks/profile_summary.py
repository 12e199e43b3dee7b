"""The device kernels of a ``jax.profiler`` trace, summed by name: what a step spends its time on.

  python benchmarks/profile_summary.py TRACE_DIR [--calls N] [--per N] [--top 15]

``TRACE_DIR`` is a ``jax.profiler.trace(dir, create_perfetto_trace=True)`` folder; the newest
``perfetto_trace.json.gz`` under it is read (Chrome trace format, plain JSON). Device kernels are
the complete events of processes whose name names a GPU or TPU; on the CPU backend (no device
process) the XLA ops of the host's threads are summed instead, so the script runs anywhere.
``--calls``: how many calls the trace holds; ``--per``: the steps of one call (decode steps of a
sampler call), so that launches per step = kernels / calls / per.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re


def load_events(trace_dir: str) -> tuple[list, dict]:
  """(complete events, {pid: process name}) of the newest perfetto trace under ``trace_dir``."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
  with gzip.open(max(paths, key=os.path.getmtime), "rt") as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  return [e for e in events if e.get("ph") == "X" and "dur" in e], names


def device_events(events: list, names: dict) -> tuple[list, str]:
  """The events of the accelerator's processes, or the host's XLA ops where there is none."""
  device = {pid for pid, name in names.items() if re.search(r"GPU|TPU|gpu|tpu", name)}
  if device:
    return [e for e in events if e["pid"] in device], "device kernels"
  wrappers = ("$", "Thunk", "PjRt", "Execute", "PjitFunction", "CommonPjRt", "while")
  host = [e for e in events if not e["name"].startswith(wrappers)]
  return host, "host events (no device process in the trace)"


# Kernel kinds, first match wins: cuBLAS / Triton / CUTLASS matmuls, fused attention, reductions,
# other XLA fusions (elementwise), data movement.
KINDS = (("matmul", r"gemm|nvjet|xmma|cutlass|cublas|dot"), ("attention", r"sdpa|fmha|flash"),
         ("reduce", r"reduce"), ("fusion", r"fusion"),
         ("copy", r"copy|transpose|memcpy|memset|Memcpy|Memset|slice"))


def kind_of(name: str) -> str:
  return next((kind for kind, pattern in KINDS if re.search(pattern, name)), "other")


def summary(trace_dir: str, calls: int = 1, per: int = 1, top: int = 15) -> str:
  events, names = load_events(trace_dir)
  picked, what = device_events(events, names)
  by_name = collections.defaultdict(lambda: [0, 0.0])
  for e in picked:
    by_name[e["name"]][0] += 1
    by_name[e["name"]][1] += float(e["dur"])
  total_us = sum(v[1] for v in by_name.values())
  launches = sum(v[0] for v in by_name.values())
  lines = [f"# profile {trace_dir}: {what}: {launches} events, {total_us / 1e3:.2f} ms busy over "
           f"{calls} call(s); per step ({calls} x {per}): {launches / calls / per:.1f} events, "
           f"{total_us / calls / per:.1f} us busy"]
  by_kind = collections.defaultdict(lambda: [0, 0.0])
  for name, (n, us) in by_name.items():
    by_kind[kind_of(name)][0] += n
    by_kind[kind_of(name)][1] += us
  lines.append("#   by kind: " + ", ".join(
      f"{kind} {100 * us / max(total_us, 1e-9):.1f}% ({us / 1e3:.2f} ms, x{n})"
      for kind, (n, us) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])))
  for name, (n, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
    lines.append(f"#   {100 * us / max(total_us, 1e-9):5.1f}%  {us / 1e3:9.3f} ms  x{n:<6d} "
                 f"{name[:110]}")
  return "\n".join(lines)


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("trace_dir")
  p.add_argument("--calls", type=int, default=1)
  p.add_argument("--per", type=int, default=1)
  p.add_argument("--top", type=int, default=15)
  a = p.parse_args()
  print(summary(a.trace_dir, a.calls, a.per, a.top))

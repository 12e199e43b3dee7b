#!/usr/bin/env bash
# GPU check of rljax on a borrowed one-GPU machine (H100/H200) with no network:
#   a. the model / rollout / algorithm tests on the GPU          (budget A_S, default 200 s)
#   b. the sampler benchmark against transformers on CUDA        (B_S, 110 s)
#   c. the GRPO train-step benchmark against the torch peer      (C_S, 45 s per setting)
#   d. the main job (SFT cold start + DAPO), short, timed        (D_S, 120 s)
#   e. benchmarks/accelerator.py (the GRPO update's MFU, the sampler against the HBM roofline,
#      the torch + SDPA peer) at the Qwen2.5-0.5B shape          (E_S, 220 s)
#      and at the Qwen2.5-1.5B shape, in a process of its own    (E2_S, 260 s)
#   p. the profile of the 0.5B update (8x2048) and sampler (64 rows): the kernels of one step
#      summed by name (benchmarks/profile_summary.py), then the sampler again with XLA's
#      command buffers (CUDA graphs) extended to while loops, against the launches per
#      decode step                                              (P_S, 200 s each)
#   s. attention on packed rows (several sequences per row, segment ids) against padded rows at
#      equal real tokens, forward + backward: cuDNN (one sequence per row: packed rows take its
#      blockwise fallback) and blockwise, at 4k and 16k slots (benchmarks/packed_attention.py)
#                                                               (S_S, 120 s)
# Every step has its own timeout, logs under $OUT and the script goes on when one fails.
#
# The default is STEPS=e, about 8.5 minutes with the set-up: a-d ran on an H200 and e on an H100
# on 2026-11-26, p on an H100 on 2026-11-27 (docs/results/benchmarks/h200.md,
# docs/results/benchmarks/h100.md); the update changed after e's figures (the log-prob head,
# 2026-11-27: measured without the torch peer), so e re-measures every figure with the peer in
# the same process. STEPS=p (about 6 minutes) profiles the update and the decode step again,
# STEPS=a (~3.5 minutes) checks the tests on the GPU.
# Run it in the repository root, with the pinned pure-python wheels in .whl/ (git-ignored through
# .git/info/exclude; the image's jax/jaxlib (CUDA plugin), torch and transformers are used as they
# are), fetched beforehand on a machine with network:
# (not flax: the pinned flax 0.12.8 needs the jax of constraints.txt, 0.10.x, and fails to import
# with the image's jax 0.11.2; the image's flax 0.12.10 works)
#   for p in optax==0.2.8 orbax-checkpoint==0.12.8 chex==0.1.92 ml_collections==1.1.0 \
#            tensorboardX==2.6.5 etils==1.15.0 toolz==1.2.0; do
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl "$p"; done
# then (OUT: the folder whose files come back; at most 8 files are written there):
#   OUT=/tmp/out bash scripts/device_check.sh
# STEPS=bd runs only steps b and d; D_EXTRA adds config overrides to d (a CPU smoke run:
# STEPS=d D_EXTRA='--config.sft.steps=3 --config.train.steps=2' bash scripts/device_check.sh),
# E_EXTRA arguments to both runs of e (a CPU smoke run: STEPS=e E_EXTRA=--smoke; a second run
# of e with E_EXTRA='--compilation-cache /tmp/xla_cache' gives the compile times of a warm
# cache).
set -u

cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check_out}
PY=${PY:-python3}
A_S=${A_S:-200}
B_S=${B_S:-110}
C_S=${C_S:-45}
D_S=${D_S:-120}
E_S=${E_S:-220}
E2_S=${E2_S:-260}
P_S=${P_S:-200}
S_S=${S_S:-120}
STEPS=${STEPS:-e}
D_EXTRA=${D_EXTRA:-}
E_EXTRA=${E_EXTRA:-}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/rljax_device_check.XXXXXX)

stamp() { echo "=== $(date -u +%FT%TZ) (+${SECONDS}s) $*"; }

# Runs "$@" under `timeout`, its output (stdout + stderr) to the terminal and appended to
# $OUT/$1.log (the two runs of e share one log: $OUT holds at most 8 files).
step() {
  local name=$1 limit=$2
  shift 2
  stamp "$name: start (timeout ${limit}s): $*"
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    stamp "$name: TIMED OUT after ${limit}s (rc $rc)"
  else
    stamp "$name: done, rc $rc"
  fi
}

main() {
  stamp "setup in $PWD, output in $OUT"
  # The pinned optax / orbax / chex / ml_collections / tensorboardX (+ etils, toolz) in front
  # of whatever the image has; jax, jaxlib, torch, transformers stay the image's.
  if ls .whl/*.whl >/dev/null 2>&1 &&
     $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target /tmp/site .whl/*.whl; then
    export PYTHONPATH=/tmp/site:$PWD
  else
    echo "WARNING: no wheels installed from .whl/: using the image's packages"
    export PYTHONPATH=$PWD
  fi
  export TF_CPP_MIN_LOG_LEVEL=3 PYTHONUNBUFFERED=1
  nvidia-smi -L
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null
  $PY - <<'EOF' 2>&1
import importlib, sys
print("python", sys.version.split()[0])
for name in ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint", "chex", "ml_collections",
             "tensorboardX", "transformers", "torch", "numpy", "etils"):
  try:
    m = importlib.import_module(name)
    print(f"{name:18s} {getattr(m, '__version__', '?'):14s} {getattr(m, '__file__', '?')}")
  except Exception as e:  # noqa: BLE001
    print(f"{name:18s} MISSING: {type(e).__name__}: {e}")
import jax
print("jax.devices():", jax.devices(), "default backend:", jax.default_backend())
import torch
print("torch.cuda:", torch.cuda.is_available(), torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
EOF

  # a. Tests. GPU float32 matmuls default to TF32 (10-bit mantissa), which breaks the 1e-5 parity
  # tolerances of these tests: they run at full float32 here. Nothing in them forces the CPU,
  # except test_make_sampler_shards_the_batch_on_data (tests/rollout/test_sampling.py), which
  # spawns a subprocess with JAX_PLATFORMS=cpu and 4 forced host devices: it runs on the CPU.
  # The transformers references of the parity tests are built on CPU torch (tests/hf_models.py).
  [[ $STEPS == *a* ]] && step a_pytest "$A_S" env JAX_DEFAULT_MATMUL_PRECISION=highest \
    $PY -m pytest -q --maxfail=10 tests/models tests/rollout tests/algos -p no:cacheprovider \
    --durations=10

  # b. Sampler throughput (default precision on both sides, as a user would run them; printed).
  [[ $STEPS == *b* ]] && step b_sampler "$B_S" $PY benchmarks/sampler.py --backend gpu \
    --models 1M,6M --batches 8,64,256,1024 --runs 5

  # c. One GRPO step, rljax against the torch peer (both on the GPU).
  [[ $STEPS == *c* ]] && step c_train_step "$C_S" $PY benchmarks/train_step.py
  [[ $STEPS == *c* ]] && step c_train_step_32 "$C_S" $PY benchmarks/train_step.py --new-tokens 32

  # e. rljax at real model sizes, each model in a process of its own so that one running out of
  # time leaves the other's figures; every row is printed as soon as it is measured.
  if [[ $STEPS == *e* ]]; then
    step e_accelerator "$E_S" $PY benchmarks/accelerator.py --models qwen2.5-0.5b $E_EXTRA
    step e_accelerator "$E2_S" $PY benchmarks/accelerator.py --models qwen2.5-1.5b $E_EXTRA
  fi

  # p. Where the time goes: one profiled update step and sampler call of the 0.5B model (their
  # traces stay on the machine; the summaries are in the log), then the sampler with while
  # loops inside XLA's CUDA graphs (an unknown flag value ends that process at start-up).
  if [[ $STEPS == *p* ]]; then
    step p_profile "$P_S" $PY benchmarks/accelerator.py --models qwen2.5-0.5b --settings 8x2048 \
      --sampler-rows 64 --no-peer --steps 2 --runs 2 --profile "$WORK/profile" $E_EXTRA
    step p_profile "$P_S" env XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=FUSION,\
CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL" $PY benchmarks/accelerator.py \
      --models qwen2.5-0.5b --settings '' --sampler-rows 64 --no-peer --runs 2 \
      --profile "$WORK/profile_graphs" $E_EXTRA
  fi

  # s. cuDNN against its blockwise fallback on packed rows (bfloat16, as auto runs float32).
  if [[ $STEPS == *s* ]]; then
    step s_packed_attention "$S_S" $PY benchmarks/packed_attention.py --max_len 4096 \
      --sequences 64 --backends cudnn,blockwise --dtype bfloat16
    step s_packed_attention "$S_S" $PY benchmarks/packed_attention.py --max_len 16384 \
      --sequences 32 --backends cudnn,blockwise --dtype bfloat16
  fi

  # d. The main job, shortened: the full SFT cold start (250 steps), 100 DAPO steps, eval only
  # before and after; every line timestamped for the SFT seconds/step.
  [[ $STEPS == *d* ]] || { stamp "all done"; return; }
  stamp "d_main: start (timeout ${D_S}s)"
  timeout -k 10 "$D_S" $PY -m rljax train --config configs/jobs/main.py \
      --config.train.steps=100 --config.train.eval_every=0 --config.train.progress=false \
      --config.train.run_dir="$WORK/run" --config.sft.out_dir="$WORK/sft" $D_EXTRA 2>&1 |
    $PY -u -c 'import sys, time
for line in sys.stdin:
  print(f"{time.time():.3f} {line}", end="", flush=True)' | tee "$OUT/d_main.log"
  stamp "d_main: done, rc ${PIPESTATUS[0]}"
  cp "$WORK/run/metrics.jsonl" "$OUT/d_metrics.jsonl" 2>/dev/null
  $PY - "$OUT/d_main.log" "$WORK/run/metrics.jsonl" <<'EOF'
import json, re, statistics, sys
log, metrics = sys.argv[1:3]
sft = []
for line in open(log, errors="replace"):
  m = re.match(r"(\d+\.\d+) sft step (\d+)/(\d+) ", line)
  if m:
    sft.append((float(m[1]), int(m[2])))
if len(sft) >= 2:
  (t0, s0), (t1, s1) = sft[0], sft[-1]
  print(f"SFT: {(t1 - t0) / (s1 - s0) * 1e3:.2f} ms/step over steps {s0 + 1}-{s1} "
        f"(after the first, compiled, step)")
else:
  print("SFT: no timing (fewer than two 'sft step' lines)")
rows = []
try:
  for line in open(metrics):
    try:
      rows.append(json.loads(line))
    except ValueError:  # a torn last line when the run was killed
      pass
except OSError as e:
  sys.exit(f"RL: no metrics ({e})")
steps = [r for r in rows if "sec_step" in r]
if len(steps) < 2:
  sys.exit(f"RL: only {len(steps)} step(s) recorded")
first, rest = steps[0], steps[1:]
for key in ("sec_step", "sec_rollout", "sec_update", "tokens_per_sec"):
  vals = [r[key] for r in rest if isinstance(r.get(key), (int, float))]
  if vals:
    print(f"RL {key}: median {statistics.median(vals):.4f}, mean {statistics.mean(vals):.4f} "
          f"over steps 2-{steps[-1]['step']} (first step, compilation included: "
          f"{first.get(key) or float('nan'):.3f})")
evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
print("eval accuracy (step, pass@1):", evals)
EOF
  stamp "all done"
}

main 2>&1 | tee "$OUT/device_check.log"
rm -rf "$WORK"

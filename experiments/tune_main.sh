#!/usr/bin/env bash
# Tuning runs for configs/jobs/main_600.py (one at a time: the machine has 2 cores).
#   experiments/tune_main.sh NAME SFT_DIR [--config.key=value ...]
# Writes runs/tune_NAME/metrics.jsonl and runs/tune_NAME.log; prints the eval curve and wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; sft=$2; shift 2
rm -rf "runs/tune_$name"
start=$(date +%s)
.venv/bin/python -m rljax train --config configs/jobs/main_600.py --config.train.progress=false \
  --config.train.run_dir="runs/tune_$name" --config.sft.out_dir="$sft" \
  --config.train.export_hf=false "$@" > "runs/tune_$name.log" 2>&1
end=$(date +%s)
echo "$name: $((end - start)) s  $*"
.venv/bin/python - "runs/tune_$name/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ev = [(r["step"], round(r["eval_accuracy"], 3)) for r in recs if "eval_accuracy" in r]
acc = [r["accuracy"] for r in recs if "accuracy" in r]
k = max(len(acc) // 5, 1)
print("  eval", ev)
print("  train acc by fifth", [round(sum(acc[i:i + k]) / len(acc[i:i + k]), 3) for i in range(0, len(acc), k)])
PY

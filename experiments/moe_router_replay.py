"""Router replay on a tiny Qwen3-MoE with bfloat16 sampling: the sampler/trainer log-prob gap and
the share of routing decisions that differ, with ``model.router_replay`` off, R2 and R3.

The sampler computes in bfloat16 (``rollout.dtype``), the trainer in float32, so the two routers
see slightly different hidden states and sometimes pick different experts (the mismatch R3, arXiv
2510.11370, removes by replaying the sampler's experts). Two minibatches per step, so the update's
forward differs from the old-log-prob forward (what R2 replays); a reward a random policy earns a
quarter of the time, so every step moves the policy. Per mode and seed it runs
``configs/algos/grpo.py`` from a random tiny model for ``--steps`` steps and prints the mean over
steps of:

- ``logp_gap_mean`` / ``logp_gap_max``: |old log-prob - sampler log-prob| over completion tokens;
- ``moe/route_mismatch``: (token, MoE layer) pairs whose experts differ between the sampler and
  the old-log-prob forward; ``moe/route_mismatch_update``: the same for the update's forward.

  python experiments/moe_router_replay.py --steps 10 --seeds 0,1 --out runs/moe_replay
"""
from __future__ import annotations

import argparse
import os
import statistics

from rljax import cli
from rljax.rewards import checkers
from rljax.runs import metrics as metrics_lib


@checkers.register_reward("char_sum_mod4")
def char_sum_mod4(completion, problem):
  """A reward a random policy earns a quarter of the time: every group has a spread, so every
  step updates the policy (between the two minibatches too, where R2 matters)."""
  return float(sum(map(ord, completion)) % 4 == 0)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MOE = {
    "model.family": "qwen3_moe", "model.hidden_size": "64", "model.intermediate_size": "128",
    "model.num_layers": "2", "model.num_heads": "4", "model.num_kv_heads": "2",
    "model.num_experts": "8", "model.experts_per_token": "2", "model.moe_intermediate_size": "64",
    "rollout.dtype": "bfloat16", "rollout.prompts_per_step": "8", "rollout.group_size": "4",
    "rollout.max_new_tokens": "32", "algo.minibatches": "2", "data.num_eval": "8",
    "reward.fn": "char_sum_mod4", "optim.lr": "1e-3",
    "train.progress": "false", "train.export_hf": "false",
}
METRICS = ("logp_gap_mean", "logp_gap_max", "moe/route_mismatch", "moe/route_mismatch_update")


def run(mode: str, seed: int, steps: int, out: str) -> dict:
  run_dir = os.path.join(out, f"{mode}_seed{seed}")
  overrides = dict(TINY_MOE, **{"model.router_replay": mode, "seed": str(seed),
                                "train.steps": str(steps), "train.run_dir": run_dir})
  cli.main(["train", "--config", os.path.join(ROOT, "configs", "algos", "grpo.py")]
           + [f"--config.{k}={v}" for k, v in overrides.items()])
  records = [r for r in metrics_lib.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
             if "loss" in r]
  return {m: statistics.mean(r[m] for r in records) for m in METRICS}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--seeds", default="0,1")
  ap.add_argument("--out", default="runs/moe_replay")
  args = ap.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  rows = {}
  for mode in ("off", "R2", "R3"):
    per_seed = [run(mode, seed, args.steps, args.out) for seed in seeds]
    rows[mode] = {m: statistics.mean(r[m] for r in per_seed) for m in METRICS}
  print(f"| router_replay | {' | '.join(METRICS)} |")
  print(f"|---|{'---|' * len(METRICS)}")
  for mode, row in rows.items():
    print(f"| {mode} | " + " | ".join(f"{row[m]:.4g}" for m in METRICS) + " |")


if __name__ == "__main__":
  main()

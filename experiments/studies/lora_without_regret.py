"""LoRA without regret at our scale ("LoRA Without Regret", Schulman and Thinking Machines Lab,
2025): for policy-gradient RL even rank-1 adapters match full fine-tuning, given a learning rate
about 10x the full fine-tune's. Full fine-tuning against adapters of rank 1, 8 and 32 on every
projection (``model.lora.targets=('all',)``), 3 seeds each, on the main job as it ran until 2026-12-02
(configs/jobs/main_600.py) shortened to its first 200 RL steps, where it gains on every seed.

  python -m rljax sweep experiments/studies/lora_without_regret.py --root runs/studies

Learning rate, per the paper's rule: the full fine-tune keeps that job's 3e-5; every LoRA
variant takes 10x, 3e-4, with alpha = 32 fixed, so that the update (alpha / r) B A has a
rank-independent best learning rate (the paper's 1/r parametrisation; B = 0 at the start, so
every run starts from the cold start). The reference of the KL term is the frozen base in
the LoRA runs and a copy of the cold start in the full fine-tune: the same weights (the main
job's DAPO has no KL term). With ``--root runs/studies`` the seeds share their cold starts with
experiments/async_main.py, the other study on configs/jobs/main_600.py.
Verdict: ``gain_accuracy`` of each rank against the full fine-tune, paired over the seeds, with
95% intervals (docs/ablations.md).
"""
from rljax.sweep.study import Study, independent

FULL_LR = 3e-5  # configs/jobs/main_600.py's
LORA_LR = 10 * FULL_LR  # "LoRA Without Regret": about 10x the full fine-tune's best


def lora(rank: int) -> dict:
  return {"model.lora.rank": rank, "model.lora.alpha": 32.0, "optim.lr": LORA_LR}


def get_study():
  return Study(
      name="lora_without_regret",
      config="configs/jobs/main_600.py",
      # Old log-probs by a scoring forward, as when the study ran (before the main job took
      # the sampler's): its recorded runs reproduce.
      overrides={"train.steps": 200, "train.eval_every": 50, "algo.old_logp": "recompute",
                 "data.num_eval": 256},
      variants=independent([
          ("full", {"optim.lr": FULL_LR}),
          ("lora_r1", lora(1)),
          ("lora_r8", lora(8)),
          ("lora_r32", lora(32)),
      ]),
      seeds=(0, 1, 2),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "best_accuracy",
               "final_entropy", "wall_time_s"),
      baseline="full",
      description="LoRA without regret: does accuracy gain with rank-1/8/32 adapters at 10x the "
                  "learning rate match full fine-tuning's?")

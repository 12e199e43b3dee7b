"""A study at the size of the trainer tests: 2 variants x 2 seeds x 2 steps of a tiny random
model (tests/train/tiny.py's sizes; exact_match reward, since subprocesses see only registered
rewards)."""
from rljax.sweep.study import Study, independent

TINY = {
    "model.source": "tiny", "model.hidden_size": 32, "model.intermediate_size": 64,
    "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
    "rollout.max_new_tokens": 8, "rollout.prompts_per_step": 2, "rollout.group_size": 4,
    "data.prompt_bucket": 8, "data.num_eval": 4, "data.difficulty": 0,
    "optim.lr": 1e-3, "train.steps": 2, "train.eval_every": 0, "train.checkpoint_every": 0,
    "train.progress": False, "train.export_hf": False,
}


def get_study():
  return Study(
      name="smoke",
      config="configs/algos/grpo.py",
      overrides=TINY,
      variants=independent([("symmetric", {}), ("clip_higher", {"algo.clip_eps_high": 0.28})]),
      seeds=(0, 1),
      metrics=("final_accuracy", "auc_accuracy", "final_entropy", "final_len_wrong",
               "wall_time_s"),
      baseline="symmetric",
      description="Smoke test of the sweep tool.")

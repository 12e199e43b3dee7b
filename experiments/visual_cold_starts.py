"""The visual task's GRPO gain over five *cold starts*, fixed before it ran: `configs/tasks/visual.py`
with `sft.seed` 1-5 (each variant trains its own SFT cold start, then GRPO with seed 30), so the
interval includes how good each cold start is, which `experiments/visual_confirm2.py` (five RL
seeds from the preset's one cold start) leaves out. Read as the runs come: the gain of each
variant's one run, mean and 95% t-interval over the five.

  python -m rljax sweep experiments/visual_cold_starts.py --root /tmp/visual --parallel 2
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="visual_cold_starts",
      config="configs/tasks/visual.py",
      variants=independent([(f"sft{k}", {"sft.seed": k}) for k in range(1, 6)]),
      seeds=(30,),
      metrics=("final_accuracy", "gain_accuracy", "best_accuracy", "wall_time_s"),
      baseline="sft1",
      description="Five cold starts (sft.seed 1-5), fixed in advance, one GRPO run each: does "
                  "GRPO raise the held-out accuracy over each one's own cold start?")

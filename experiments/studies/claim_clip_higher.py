"""Claim (DAPO, arXiv 2503.14476, section 3.1): clip-higher (eps_high 0.28 against a symmetric
0.2) keeps the policy's entropy up and lets low-probability tokens rise, at no cost in accuracy.

  python -m rljax sweep experiments/studies/claim_clip_higher.py --root runs/studies

On the study scale (configs/studies/main_150.py: the main job's first 150 RL steps), five seeds. The
baseline is the main job as it is (eps_high 0.28); the variant removes clip-higher. Its
updates are off-policy from the second of 4 minibatches on, so the upper clip binds on a
measured fraction of tokens (``clip_frac_high`` in metrics.jsonl). Verdict:
docs/results/claims/README.md.
"""
from rljax.sweep.study import Study, independent


def get_study():
  return Study(
      name="claim_clip_higher",
      config="configs/studies/main_150.py",
      variants=independent([
          ("dapo", {}),
          ("sym_0.20", {"algo.clip_eps_high": 0.2}),
      ]),
      seeds=(0, 1, 2, 3, 4),
      metrics=("final_entropy", "final_accuracy", "gain_accuracy", "auc_accuracy",
               "wall_time_s"),
      baseline="dapo",
      description="Clip-higher: is the entropy lower and accuracy no better with symmetric "
                  "clipping 0.2 than with eps_high 0.28?")

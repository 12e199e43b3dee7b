"""The study scale of the seeds' claims: the main job (configs/main.py, DAPO on embedded
arithmetic level 0 from its exact-match cold start) for its first 200 RL steps.

  python -m rljax sweep experiments/studies/claim_clip_higher.py --root runs/studies

Its constant learning rate makes a 200-step run the main job's first 200 steps to the digit as
the main job ran before it took the sampler's log-probs (``algo.old_logp``, kept at 'recompute'
here), and its cold starts are the main job's (the same ``sft`` keys), so under one ``--root`` every study on
it shares them with experiments/main_job_seeds.py. Gains per seed, their spread and the effect a
5-seed study can detect: docs/results/ablations.md. (configs/study.py is the former scale,
arithmetic level 1 for 100 steps, on which GRPO did not learn.)
"""
from rljax.config_loader import preset


def get_config():
  c = preset(__file__, "main.py")
  # The claim studies of docs/results/ablations.md ran with a scoring forward for the old
  # log-probs, before the main job took the sampler's; kept so that they reproduce.
  c.algo.old_logp = "recompute"
  c.data.num_eval = 256  # as when they ran (the main job now evaluates all 943 held-out problems)
  c.train.steps = 200
  c.train.run_dir = "runs/study_main"
  return c

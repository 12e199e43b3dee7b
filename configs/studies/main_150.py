"""The study scale of the seeds' claims: the main job's first 150 steps (configs/jobs/main.py, DAPO
on embedded arithmetic level 0 from its exact-match cold start).

  python -m rljax sweep experiments/studies/claim_clip_higher.py --root runs/studies

The main job's learning rate is constant after warmup, so a run here is the first 150 steps of
the main job's run of the same seed. 150 steps, not 200: on one core the main job's 200 steps
took 157-189 s of RL steps over five seeds, over the study scale's 3 minutes a run once startup
and evals are added, and its first 150 took 114-137 s while every seed had gained +23 or more
(docs/results/claims/README.md, the study scale). Its cold starts are the main job's (the same
``sft`` keys), so under one ``--root`` every study on it shares them with
experiments/main_job_seeds.py. Gains per seed, their spread and the effect a 5-seed study can
detect: docs/results/claims/README.md. The claims were first judged on the former scale, the first
200 steps of configs/jobs/main_600.py with old log-probs from a scoring forward on 256 held-out
problems; the sweep reproduces those runs with

  --set train.steps=200 --set rollout.prompts_per_step=16 --set rollout.group_size=8
  --set optim.lr=3e-5 --set sft.stop_match=0.4 --set algo.old_logp=recompute
  --set data.num_eval=256

(configs/studies/arith_l1_grpo.py is an older scale, arithmetic level 1 for 100 steps, on which
GRPO did not learn.)
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("jobs/main.py")
  c.train.steps = 150
  c.train.run_dir = "runs/study_main"
  return c

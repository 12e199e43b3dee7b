"""The study files of experiments/studies: each loads, every variant's config loads with its
overrides (a misspelt key fails here, not an hour into a study), and they share cold starts."""
import glob
import sys
import os

import pytest

from rljax.sweep import runner
from rljax.sweep import study as study_lib

STUDIES = sorted(glob.glob(os.path.join(study_lib.REPO_ROOT, "experiments", "studies", "*.py")))


def test_the_six_studies_of_issue_15_are_there():
  names = {os.path.basename(p)[:-3] for p in STUDIES}
  assert {"dapo_ladder", "clip_higher", "dr_grpo_length", "vapo_ladder", "kl_variants"} <= names
  assert len(names) >= 6


def test_each_claim_of_the_seeds_is_a_five_seed_study_on_the_study_scale():
  claims = [study_lib.load_study(p) for p in STUDIES if os.path.basename(p).startswith("claim_")]
  assert {s.name for s in claims} == {"claim_clip_higher", "claim_dr_grpo", "claim_token_vs_seq",
                                      "claim_dynamic_sampling", "claim_kl"}
  for study in claims:
    assert study.config == "configs/studies/main_150.py" and len(study.seeds) >= 5
    assert len(study.variants) == 2


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: os.path.basename(p)[:-3])
def test_study_plans_every_run(path, tmp_path):
  study = study_lib.load_study(path)
  assert study.name == os.path.basename(path)[:-3]
  specs = runner.plan_runs(study, str(tmp_path))
  assert len(specs) == len(study.variants) * len(study.seeds) and len(study.seeds) >= 3
  assert all(s.steps > 0 and s.sft_dir for s in specs)
  assert all(dict(s.overrides)["train.progress"] == "false" for s in specs)  # no bar in the logs


def test_studies_of_one_base_config_share_one_cold_start_over_their_seeds(tmp_path):
  dirs = {}
  for path in STUDIES + [os.path.join(study_lib.REPO_ROOT, "experiments", "main_job_seeds.py")]:
    study = study_lib.load_study(path)
    for spec in runner.plan_runs(study, str(tmp_path)):
      dirs.setdefault(study.config, set()).add(spec.sft_dir)
  assert all(len(d) == 1 for d in dirs.values()), dirs
  assert set(dirs) >= {"configs/studies/arith_l1_grpo.py", "configs/jobs/main.py",
                       "configs/studies/main_150.py"}
  # The claims' study scale is the main job: the main job's cold start.
  assert dirs["configs/studies/main_150.py"] == dirs["configs/jobs/main.py"]


def test_each_seed_of_the_rlhf_study_has_one_reward_model_its_kl_arms_share(tmp_path):
  study = study_lib.load_study(os.path.join(study_lib.REPO_ROOT, "experiments", "studies",
                                            "rlhf_overoptimization.py"))
  source = {}
  for spec in runner.plan_runs(study, str(tmp_path)):
    keys = dict(spec.overrides)
    rm_dir = keys["reward.model.source"].removeprefix("run:")
    assert rm_dir.startswith(str(tmp_path / "_rlhf_rm" / f"seed{spec.seed}-"))
    assert keys["rm.train_file"] == rm_dir + ".pairs.jsonl"
    source.setdefault(spec.seed, set()).add(rm_dir)
  assert all(len(dirs) == 1 for dirs in source.values()) and len(source) == len(study.seeds)
  # What `rljax rm` reads (here its learning rate) names another reward model.
  other = runner.plan_runs(study, str(tmp_path), extra=[("optim.lr", "1e-4")])
  assert dict(other[0].overrides)["reward.model.source"] not in source[other[0].seed]


def test_the_runs_of_a_sweep_share_one_compilation_cache_unless_one_is_set(tmp_path, monkeypatch):
  show = (sys.executable, "-c", "import os; print(os.environ['JAX_COMPILATION_CACHE_DIR'])")
  job = runner.Job("show", show, str(tmp_path / "show.log"), None)
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  runner.run_jobs([job], parallel=1, log=lambda line: None,
                  env=runner.shared_cache_env(str(tmp_path / "root")))
  assert open(job.log_path).read().splitlines()[-1] == str(tmp_path / "root" / "_xla_cache")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  assert runner.shared_cache_env(str(tmp_path / "root")) == {}


def test_dapo_ladder_is_cumulative():
  study = study_lib.load_study(os.path.join(study_lib.REPO_ROOT, "experiments", "studies",
                                            "dapo_ladder.py"))
  top = dict(study.variants[-1].overrides)
  assert top == {"algo.overlong_filter": "true", "algo.clip_eps_high": "0.28",
                 "reward.overlong_buffer": "5", "reward.overlong_penalty": "1.0",
                 "algo.loss_agg": "token_mean", "algo.dynamic_sampling": "true",
                 "algo.max_gen_batches": "3"}
  assert study.variants[0].overrides == ()


def test_a_run_that_exits_cleanly_before_its_last_step_is_not_reported_ok(tmp_path):
  # A preempted `rljax train` exits 0 after saving; the sweep must not call that run done.
  finished_dir, stopped_dir = tmp_path / "finished", tmp_path / "stopped"
  for d in (finished_dir, stopped_dir):
    d.mkdir()
  (finished_dir / "metrics.jsonl").write_text('{"step": 3, "eval_accuracy": 0.5}\n')
  (stopped_dir / "metrics.jsonl").write_text('{"step": 2, "reward_mean": 0.5}\n')
  jobs = [runner.Job(name, (sys.executable, "-c", "pass"), str(d / "sweep.log"), None,
                     spec=runner.RunSpec(name, 0, str(d), (), 3, None))
          for name, d in (("finished", finished_dir), ("stopped", stopped_dir))]
  lines = []
  runner.run_jobs(jobs, parallel=1, log=lines.append)
  done = [line for line in lines if line.startswith("done")]
  assert done[0].startswith("done  finished: ok in")
  assert done[1].startswith("done  stopped: stopped before its last step")

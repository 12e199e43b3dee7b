"""The aggregation math of rljax.sweep against hand-worked examples, and study-file validation."""
import dataclasses
import json
import math
import os

import numpy as np
import pytest

from rljax.config import loader as config_loader
from rljax.sweep import aggregate, plots, runner
from rljax.sweep import study as study_lib
from rljax.sweep.study import StudyError

# Student t critical values t_{0.975, df} from a printed table (e.g. NIST/SEMATECH 1.3.6.7.2).
T_TABLE = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 29: 2.045}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_critical_matches_the_printed_table(df):
  assert aggregate.t_critical(df) == pytest.approx(T_TABLE[df], abs=5e-4)


def test_mean_ci_hand_worked():
  # 0.5, 0.6, 0.7: mean 0.6, s = 0.1, half width 4.302653 * 0.1 / sqrt(3) = 0.248414.
  n, mean, low, high = aggregate.mean_ci([0.5, 0.6, 0.7])
  assert n == 3 and mean == pytest.approx(0.6)
  assert low == pytest.approx(0.6 - 0.248414, abs=1e-6)
  assert high == pytest.approx(0.6 + 0.248414, abs=1e-6)


def test_mean_ci_drops_missing_values_and_has_no_interval_for_one_seed():
  assert aggregate.mean_ci([0.5, None, math.nan, 0.7])[:2] == (2, pytest.approx(0.6))
  n, mean, low, high = aggregate.mean_ci([0.4])
  assert (n, mean) == (1, 0.4) and math.isnan(low) and math.isnan(high)
  assert aggregate.mean_ci([])[0] == 0


def test_paired_difference_hand_worked():
  # d = (0.05, 0.10, 0.02): mean 0.056667, s = 0.040415, half = 4.302653 s / sqrt(3) = 0.100397.
  variant = {0: 0.55, 1: 0.70, 2: 0.62, 3: 0.9}  # seed 3 has no baseline run: not paired
  baseline = {0: 0.50, 1: 0.60, 2: 0.60}
  n, mean, low, high = aggregate.paired_difference(variant, baseline)
  assert n == 3 and mean == pytest.approx(0.0566667, abs=1e-6)
  assert low == pytest.approx(0.0566667 - 0.100397, abs=1e-5)
  assert high == pytest.approx(0.0566667 + 0.100397, abs=1e-5)
  assert aggregate.direction(low, high) == "~"


def test_pairing_concludes_where_seed_spread_would_hide_the_effect():
  baseline = {0: 0.2, 1: 0.5, 2: 0.8}
  variant = {0: 0.25, 1: 0.56, 2: 0.84}  # d = 0.05, 0.06, 0.04: mean 0.05, s 0.01
  n, mean, low, high = aggregate.paired_difference(variant, baseline)
  half = 4.302653 * 0.01 / math.sqrt(3)
  assert (low, high) == (pytest.approx(0.05 - half), pytest.approx(0.05 + half))
  assert aggregate.direction(low, high) == "+"
  # Unpaired, the two means' intervals overlap almost entirely.
  assert aggregate.mean_ci(variant.values())[2] < aggregate.mean_ci(baseline.values())[3]
  assert aggregate.direction(-0.3, -0.1) == "-"


def test_area_under_curve_hand_worked():
  # Equal spacing: 50 * (0.45 + 0.5 + 0.6) / 150 = 0.516667.
  assert aggregate.area_under_curve([0, 50, 100, 150], [0.4, 0.5, 0.5, 0.7]) \
      == pytest.approx(77.5 / 150)
  import numpy as np
  # Unequal spacing: (10 * 0.3 + 90 * 0.4) / 100 = 0.39; a flat curve has its own value.
  assert aggregate.area_under_curve(np.array([0, 10, 100]), np.array([0.2, 0.4, 0.4])) \
      == pytest.approx(0.39)
  assert aggregate.area_under_curve(np.array([0, 7, 30]), np.full(3, 0.4)) == pytest.approx(0.4)
  assert aggregate.area_under_curve(np.array([5]), np.array([0.3])) == 0.3


def _records():
  """Records as MetricsWriter writes them: eval at 0, 20 train steps, eval every 10, final eval
  on its own line at the last step (after that step's train line), one null value."""
  records = [{"step": 0, "eval_accuracy": 0.2}]
  for step in range(1, 21):
    r = {"step": step, "accuracy": 0.1 * (step % 3), "entropy": 1.0 - 0.01 * step,
         "truncation_rate": 0.5 if step <= 10 else 0.1, "len_mean": 20.0 + step,
         "len_correct_mean": 18.0, "len_wrong_mean": None if step == 20 else 30.0 + step,
         "generated_samples": 64.0 if step % 2 else 128.0}  # a second dynamic-sampling round
    if step == 10:
      r["eval_accuracy"] = 0.6
    records.append(r)
  records.append({"step": 20, "eval_accuracy": 0.4})
  return records


def test_run_summary_hand_worked():
  s = aggregate.run_summary(_records(), [{"wall_s": 10.0, "returncode": 1},
                                         {"wall_s": 5.5, "returncode": 0}])
  assert s["final_accuracy"] == 0.4 and s["best_accuracy"] == 0.6
  assert s["gain_accuracy"] == pytest.approx(0.4 - 0.2)
  # Evals (0, 0.2), (10, 0.6), (20, 0.4): (10 * 0.4 + 10 * 0.5) / 20 = 0.45.
  assert s["auc_accuracy"] == pytest.approx(0.45)
  # Final window: ceil(0.1 * 20) = 2 steps (19, 20).
  assert s["final_entropy"] == pytest.approx((0.81 + 0.80) / 2)
  assert s["final_len_mean"] == pytest.approx(39.5)
  assert s["final_len_correct"] == pytest.approx(18.0)
  # Step 20 logged null: its last two logged values are steps 18 and 19.
  assert s["final_len_wrong"] == pytest.approx((48 + 49) / 2)
  assert s["final_truncation_rate"] == pytest.approx(0.1)
  assert s["mean_truncation_rate"] == pytest.approx(0.3)
  assert s["wall_time_s"] == pytest.approx(15.5)
  # 10 steps of 64 and 10 of 128 completions; +20 points over 1,920 samples.
  assert s["generated_samples"] == 1920.0
  assert s["gain_per_1k_samples"] == pytest.approx(20 / 1.92)
  assert set(s) == set(study_lib.SUMMARY_METRICS)


def test_run_summary_marks_unlogged_metrics_nan():
  records = [{k: v for k, v in r.items()
              if k not in ("len_correct_mean", "len_wrong_mean", "generated_samples")}
             for r in _records()]
  s = aggregate.run_summary(records)
  assert math.isnan(s["final_len_correct"]) and math.isnan(s["wall_time_s"])
  assert math.isnan(s["generated_samples"]) and math.isnan(s["gain_per_1k_samples"])
  assert aggregate.fmt("final_len_correct", s["final_len_correct"]) == "n/a"


def test_generated_samples_of_a_run_logged_before_the_metric_come_from_its_rounds():
  # 20 steps, steps 3, 6, ..., 18 with a second dynamic-sampling round: 26 rounds of 8 x 4.
  records = [{k: v for k, v in r.items() if k != "generated_samples"} for r in _records()]
  for r in records:
    if "accuracy" in r:
      r["gen_rounds"] = 2 if r["step"] % 3 == 0 else 1
  s = aggregate.run_summary(records, samples_per_round=32)
  assert s["generated_samples"] == 26 * 32
  assert s["gain_per_1k_samples"] == pytest.approx(20 / (26 * 32 / 1000))
  assert aggregate.fmt("generated_samples", 832.0) == "832"  # a count, not a rate


def _study(**kw):
  args = dict(name="s", config="configs/algos/grpo.py",
              variants=study_lib.independent([("a", {}), ("b", {"algo.clip_eps_high": 0.28})]),
              seeds=(0, 1, 2), metrics=("final_accuracy", "wall_time_s"), baseline="a")
  args.update(kw)
  return study_lib.Study(**args)


def test_summarize_study_and_markdown():
  study = _study()
  summaries = {}
  for seed, (a, b) in enumerate([(0.5, 0.55), (0.6, 0.70), (0.6, 0.62)]):
    summaries[("a", seed)] = dict.fromkeys(study_lib.SUMMARY_METRICS, math.nan) | {
        "final_accuracy": a}
    summaries[("b", seed)] = dict.fromkeys(study_lib.SUMMARY_METRICS, math.nan) | {
        "final_accuracy": b}
  rows = {(r["variant"], r["metric"]): r for r in aggregate.summarize_study(study, summaries)}
  b = rows[("b", "final_accuracy")]
  assert b["diff_n"] == 3 and b["diff_mean"] == pytest.approx(0.0566667, abs=1e-6)
  assert b["diff_low"] == pytest.approx(0.0566667 - 0.100397, abs=1e-5)
  assert rows[("a", "final_accuracy")]["diff_sign"] == ""
  text = aggregate.markdown_table(study, list(rows.values()))
  assert "| b | 3 | +5.7% [-4.4%, 15.7%] ~ | n/a ~ |" in text
  assert "| a | 3 | 56.7%" in text


def test_ladder_is_cumulative_and_independent_is_not():
  rungs = [("base", {}), ("x", {"algo.overlong_filter": True}),
           ("y", {"algo.clip_eps_high": 0.28}), ("z", {"algo.overlong_filter": False})]
  ladder = study_lib.ladder(rungs)
  assert ladder[2].overrides == (("algo.overlong_filter", "true"),
                                 ("algo.clip_eps_high", "0.28"))
  assert dict(ladder[3].overrides) == {"algo.overlong_filter": "false",
                                       "algo.clip_eps_high": "0.28"}
  assert study_lib.independent(rungs)[2].overrides == (("algo.clip_eps_high", "0.28"),)


@pytest.mark.parametrize("value,kind", [(True, bool), (0.28, float), (3, int), (None, float),
                                        ((0.1, 0.9), tuple), ("token_mean", str)])
def test_override_values_read_back_by_the_config_loader(value, kind):
  text = study_lib.cli_value(value)
  assert config_loader.parse_value(text, kind, "k") == value


@pytest.mark.parametrize("change,message", [
    (dict(baseline="c"), "baseline 'c' is not a variant"),
    (dict(metrics=("final_acc",)), "not summary metrics"),
    (dict(seeds=(1, 1)), "seeds must be distinct"),
    (dict(overrides={"seed": 3}), "which the sweep sets per run"),
    (dict(variants=study_lib.independent([("a", {}), ("a", {})])), "variant names repeat"),
])
def test_bad_study_is_refused_naming_the_problem(change, message):
  with pytest.raises(ValueError, match=message):
    _study(**change)


def test_plan_sets_seed_data_order_and_one_cold_start_for_all_seeds(tmp_path):
  study = _study(config="configs/studies/arith_l1_grpo.py")
  specs = runner.plan_runs(study, str(tmp_path))
  assert [(s.variant, s.seed) for s in specs] == [(v, k) for v in "ab" for k in (0, 1, 2)]
  first = dict(specs[0].overrides)
  assert first["seed"] == first["data.train_seed"] == "0"
  assert first["train.run_dir"] == str(tmp_path / "s" / "a" / "seed0")
  # The seeds are RL runs from one cold start, shared by the variants (algorithm keys only).
  assert len({s.sft_dir for s in specs}) == 1
  assert os.path.dirname(specs[0].sft_dir) == str(tmp_path / "_sft")
  argv = runner.train_argv(specs[4], study.config_path())
  # A new run starts fresh (the trainer refuses resume=True on a dir that holds no run) ...
  assert "--config.train.resume=True" not in argv and "--config.algo.clip_eps_high=0.28" in argv
  # ... one that has started resumes.
  os.makedirs(specs[4].run_dir)
  with open(os.path.join(specs[4].run_dir, "config.json"), "w") as f:
    f.write('{"train": {"steps": 2}}')  # an rljax config (an HF export's config.json is not)
  assert runner.train_argv(specs[4], study.config_path())[-1] == "--config.train.resume=True"


def test_a_variant_of_another_sft_seed_has_its_own_cold_start(tmp_path):
  study = _study(config="configs/studies/arith_l1_grpo.py", variants=study_lib.independent(
      [("a", {}), ("other_base", {"sft.seed": 7})]))
  dirs = {(s.variant, s.seed): s.sft_dir for s in runner.plan_runs(study, str(tmp_path))}
  assert dirs[("a", 0)] == dirs[("a", 2)] != dirs[("other_base", 0)] == dirs[("other_base", 2)]


def test_run_state_from_the_run_dir(tmp_path):
  spec = runner.RunSpec("a", 0, str(tmp_path), (), steps=2, sft_dir=None)
  assert runner.run_state(spec) == "new"
  (tmp_path / "checkpoints" / "1").mkdir(parents=True)  # an uncommitted save: not resumable
  assert runner.run_state(spec) == "new"
  (tmp_path / "checkpoints" / "1" / "commit_success.txt").write_text("")
  assert runner.run_state(spec) == "partial"
  lines = [{"step": 0, "eval_accuracy": 0.1}, {"step": 2, "accuracy": 0.5}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  assert runner.run_state(spec) == "partial"  # the last train step, but not the final eval
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 2, "eval_accuracy": 0.2}) + "\n")
  assert runner.run_state(spec) == "finished"


def test_moving_average_and_seed_band_hand_worked():
  # Centred, window 3; the ends average the part of the window that exists.
  np.testing.assert_allclose(plots.moving_average(np.arange(1.0, 6.0), 3),
                             [1.5, 2, 3, 4, 4.5])
  assert plots.smooth_window(150) == 7 and plots.smooth_window(10) == 1
  # Two seeds aligned on their common steps (0, 10); at step 10: mean 0.5, s = 0.1 * sqrt(2),
  # half = 12.706 * s / sqrt(2) = 1.2706.
  steps, mean, low, high = plots.seed_band([(np.array([0, 5, 10]), np.array([0.1, 0.2, 0.4])),
                                            (np.array([0, 10]), np.array([0.1, 0.6]))])
  np.testing.assert_array_equal(steps, [0, 10])
  np.testing.assert_allclose(mean, [0.1, 0.5])
  np.testing.assert_allclose(high - mean, [0.0, 12.7062 * 0.1], rtol=1e-4)


def test_gain_curve_subtracts_each_runs_first_eval(tmp_path):
  steps, gain = plots.run_curve(_records(), plots.GAIN)  # evals (0, 0.2), (10, 0.6), (20, 0.4)
  np.testing.assert_array_equal(steps, [0, 10, 20])
  np.testing.assert_allclose(gain, [0.0, 0.4, 0.2])
  other = [dict(r, eval_accuracy=r["eval_accuracy"] + 0.3) if "eval_accuracy" in r else r
           for r in _records()]
  np.testing.assert_allclose(plots.run_curve(other, plots.GAIN)[1], gain)  # the cold start cancels
  drawn = plots.plot_study({("a", 0): _records(), ("a", 1): other}, ["a"],
                           str(tmp_path / "c.png"), title="t")
  assert drawn[:2] == ["eval_accuracy", plots.GAIN] and (tmp_path / "c.png").stat().st_size > 0


def test_a_finished_run_of_an_older_default_is_aggregated_and_a_changed_study_is_refused(tmp_path):
  study = _study(config="configs/studies/arith_l1_grpo.py")
  spec = runner.plan_runs(study, str(tmp_path))[4]  # variant b: algo.clip_eps_high=0.28
  os.makedirs(spec.run_dir)
  config = json.loads(config_loader.load_config(study.config_path(), list(spec.overrides))
                      .to_json_best_effort())
  saved = os.path.join(spec.run_dir, "config.json")

  def save(**changes):
    tree = json.loads(json.dumps(config))
    for key, value in changes.items():
      section, name = key.split(".")
      tree[section][name] = value
    with open(saved, "w") as f:
      json.dump(tree, f)

  save(**{"train.progress": True, "train.compilation_cache": False})  # ignored keys
  assert runner.check_same_config(spec, study.config_path(), finished=True) == []
  # The framework's default of model.attention_block moved after the run: aggregated, with a note.
  # Its cold start's directory, named by a hash of the config, moved with it: a bookkeeping key,
  # compared by what it depends on (the cold start's stamp is checked when it is loaded).
  save(**{"model.attention_block": config["model"]["attention_block"] + 1,
          "sft.out_dir": "/elsewhere/seed1-0123456789"})
  notes = runner.check_same_config(spec, study.config_path(), finished=True)
  assert [n.split(":")[0] for n in notes] == ["model.attention_block"]
  with pytest.raises(StudyError, match="model.attention_block"):  # cannot be resumed
    runner.check_same_config(spec, study.config_path(), finished=False)
  # What the study sets (its base config's lr, the variant's eps_high) must match.
  for key in ("optim.lr", "algo.clip_eps_high"):
    section, name = key.split(".")
    save(**{key: config[section][name] * 2})
    with pytest.raises(StudyError, match=key):
      runner.check_same_config(spec, study.config_path(), finished=True)


def test_a_run_made_before_a_key_existed_did_what_its_default_does(tmp_path):
  # A finished run whose config.json lacks algo.old_logp (added to rljax after it ran).
  first = _study(seeds=(0,), variants=study_lib.independent([("a", {})]))
  spec = runner.plan_runs(first, str(tmp_path))[0]
  os.makedirs(spec.run_dir)
  tree = json.loads(config_loader.load_config(first.config_path(), list(spec.overrides))
                    .to_json_best_effort())
  del tree["algo"]["old_logp"]
  with open(os.path.join(spec.run_dir, "config.json"), "w") as f:
    json.dump(tree, f)
  with open(os.path.join(spec.run_dir, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": spec.steps, "eval_accuracy": 0.5}) + "\n")

  def asking(value, name):
    study = _study(name=name, seeds=(0,), baseline="x",
                   variants=study_lib.independent([("x", {"algo.old_logp": value})]))
    return study, runner.plan_runs(study, str(tmp_path))[0]

  # A study that names the default: the same run (aggregated with a note, or linked as a twin).
  study, same = asking("recompute", "t")
  notes = runner.check_same_config(dataclasses.replace(same, run_dir=spec.run_dir),
                                   study.config_path(), finished=True)
  assert [n.split(":")[0] for n in notes] == ["algo.old_logp"]
  assert runner.finished_twin(same, study.config_path()) == spec.run_dir
  # Another value: another run.
  study, other = asking("sampler", "u")
  with pytest.raises(StudyError, match="algo.old_logp"):
    runner.check_same_config(dataclasses.replace(other, run_dir=spec.run_dir),
                             study.config_path(), finished=True)
  assert runner.finished_twin(other, study.config_path()) is None


def test_a_run_another_study_finished_with_the_same_config_is_linked_not_rerun(tmp_path):
  # Study "s" ran variant a (the default clip) and b (eps_high 0.28) on seed 0; study "t" asks
  # for b under another name and for eps_high 0.3, which nothing ran.
  first = _study(seeds=(0,))
  for spec in runner.plan_runs(first, str(tmp_path)):
    os.makedirs(spec.run_dir)
    config = config_loader.load_config(first.config_path(), list(spec.overrides))
    with open(os.path.join(spec.run_dir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort())
    final = spec.steps if spec.variant == "a" else spec.steps - 1  # b stopped before its end
    with open(os.path.join(spec.run_dir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": final, "eval_accuracy": 0.5}) + "\n")
  second = _study(name="t", seeds=(0,), baseline="base", variants=study_lib.independent(
      [("base", {"algo.clip_eps_high": 0.2}), ("same_as_b", {"algo.clip_eps_high": 0.28}),
       ("new", {"algo.clip_eps_high": 0.3})]))
  specs = runner.plan_runs(second, str(tmp_path))
  # "base" was queued once before, by a sweep stopped before its run started: only the sweep's
  # log and wall record are there, so it is still linked.
  os.makedirs(specs[0].run_dir)
  for name in (runner.LOG_FILE, runner.WALL_FILE):
    with open(os.path.join(specs[0].run_dir, name), "w") as f:
      f.write("[]" if name == runner.WALL_FILE else "stopped before the run started\n")
  _, train_jobs, states = runner.pending_jobs(specs, second.config_path())
  assert states == {("base", 0): "finished", ("same_as_b", 0): "new", ("new", 0): "new"}
  assert [j.run for j in train_jobs] == ["same_as_b/seed0", "new/seed0"]  # b is not finished
  assert os.path.realpath(specs[0].run_dir) == os.path.realpath(tmp_path / "s" / "a" / "seed0")
  assert runner.run_state(specs[0]) == "finished"
  # The next sweep of "t" finds the link finished and its config the same (only the run dir,
  # which the linked run's config names, differs).
  _, train_jobs, states = runner.pending_jobs(specs, second.config_path())
  assert states[("base", 0)] == "finished" and len(train_jobs) == 2

"""MetricsWriter (JSON lines, TensorBoard, progress), resume truncation, summarize, plots."""
import glob
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.runs import metrics as metrics_lib
from rljax.runs.metrics import MetricsWriter, read_jsonl, summarize
from rljax.runs.plot import plot_compare, plot_run


def step_metrics(step):
  return {"reward_mean": 0.1 * step, "accuracy": step / 10, "entropy": 1.0 - 0.05 * step,
          "len_mean": 20.0 + step, "sec_step": 0.5}


def run_like_trainer(run_dir, steps, start=0, stop=None, checkpoint_every=2):
  """Write as rljax.train.loop does: eval at 0, steps 1..N, final eval at N; `stop` kills the run
  after writing that step (and a torn half line). Returns the last checkpointed step."""
  writer = MetricsWriter(run_dir, enabled=True, progress_total=steps, progress=False,
                         start_step=start)
  if start == 0:
    writer.write(0, {"eval_accuracy": 0.0})
    writer.write_named("pretrain", 0, {"value_loss": 1.0})
  checkpoint = start
  for done in range(start + 1, steps + 1):
    writer.write(done, step_metrics(done))
    if done % checkpoint_every == 0:
      checkpoint = done
    if done == stop:
      writer.close()
      with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write('{"step": %d, "rew' % (done + 1))  # killed in the middle of a write
      return checkpoint
  writer.write(steps, {"eval_accuracy": 0.9})
  writer.close()
  return checkpoint


def test_write_jsonl_tensorboard_and_nonfinite(tmp_path):
  run_dir = str(tmp_path / "run")
  with MetricsWriter(run_dir, enabled=True, progress_total=3, progress=False) as writer:
    writer.write(1, {"reward_mean": jnp.float32(0.5), "kl": np.float64("nan"), "n": 3})
    writer.write(2, {"reward_mean": float("inf")})
    with pytest.raises(TypeError, match="'bad'"):
      writer.write(3, {"bad": "text"})
  assert read_jsonl(os.path.join(run_dir, "metrics.jsonl")) == [
      {"step": 1, "reward_mean": 0.5, "kl": None, "n": 3.0},
      {"step": 2, "reward_mean": None}]
  events = glob.glob(os.path.join(run_dir, "tb", "events.out.tfevents.*"))
  assert events and os.path.getsize(events[0]) > 0


def test_tensorboard_logger_starts_without_torch(tmp_path):
  """tensorboardX's writer would import torch (installed here) for its type hints: ~2.5 s of every
  run's start. A fresh process logs a scalar without it, and leaves no mark in ``sys.modules``
  (None there would make a later ``import torch``, a Hugging Face export's, fail)."""
  code = ("import sys; from rljax.runs import metrics; "
          f"metrics.TensorBoardLogger({str(tmp_path)!r}, 0).log(1, {{'a': 1.0}}); "
          "print('torch' in sys.modules)")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=root))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["False"]
  assert glob.glob(os.path.join(tmp_path, "tb", "events.out.tfevents.*"))


def test_resumed_file_equals_uninterrupted(tmp_path):
  full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
  run_like_trainer(full, steps=7)
  checkpoint = run_like_trainer(cut, steps=7, stop=5)  # checkpoints at 2 and 4, killed after 5
  assert checkpoint == 4
  run_like_trainer(cut, steps=7, start=checkpoint)
  for name in ("metrics.jsonl", "pretrain.jsonl"):
    assert read_jsonl(os.path.join(cut, name)) == read_jsonl(os.path.join(full, name))
  steps = [r["step"] for r in read_jsonl(os.path.join(cut, "metrics.jsonl"))]
  assert steps == [0, 1, 2, 3, 4, 5, 6, 7, 7]
  # Each stream has its own TensorBoard directory (a resume purges only the main one).
  assert glob.glob(os.path.join(cut, "tb", "pretrain", "events.out.tfevents.*"))


def test_fresh_start_replaces_and_none_appends(tmp_path):
  run_dir = str(tmp_path / "run")
  path = os.path.join(run_dir, "metrics.jsonl")
  run_like_trainer(run_dir, steps=3)
  with MetricsWriter(run_dir, enabled=True, progress_total=None, progress=False,
                     start_step=None) as writer:
    writer.write(9, {"x": 1.0})
  assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2, 3, 3, 9]
  with MetricsWriter(run_dir, enabled=True, progress_total=None, progress=False,
                     start_step=0) as writer:
    writer.write(0, {"x": 2.0})
  assert read_jsonl(path) == [{"step": 0, "x": 2.0}]


def test_disabled_writer_touches_nothing(tmp_path):
  run_dir = str(tmp_path / "run")
  with MetricsWriter(run_dir, enabled=False, progress_total=3, progress=True,
                     start_step=0) as writer:
    writer.write(1, {"x": 1.0})
    writer.write_named("pretrain", 0, {"x": 1.0})
    writer.log("hidden")
  assert not os.path.exists(run_dir)


def test_progress_bar_and_log(tmp_path, capsys):
  with MetricsWriter(str(tmp_path), enabled=True, progress_total=10, progress=True,
                     start_step=4) as writer:
    writer.write(5, {**step_metrics(5), "kl": 0.01, "other": 3.0})
    assert writer._bar.n == 5
    postfix = writer._bar.postfix
    assert "reward_mean=0.5" in postfix and "kl=0.01" in postfix and "other" not in postfix
    writer.log("eval after training: accuracy 0.500")
  assert "eval after training" in capsys.readouterr().out


def test_read_jsonl_rejects_corruption_before_the_end(tmp_path):
  path = str(tmp_path / "m.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
  with pytest.raises(ValueError, match=":2: not JSON"):
    read_jsonl(path)


def test_summarize():
  values = {"loss": (np.float32(3.0), np.int32(4)), "kl": (jnp.zeros(()), jnp.zeros(())),
            "entropy": (1.0, 2)}
  assert summarize(values) == {"loss": 0.75, "entropy": 0.5}
  with pytest.raises(TypeError, match="'loss'"):
    summarize({"loss": 1.0})


def test_plots(tmp_path):
  run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
  run_like_trainer(run_a, steps=6)
  run_like_trainer(run_b, steps=4)
  png = str(tmp_path / "curves.png")
  plotted = plot_run(os.path.join(run_a, "metrics.jsonl"), png,
                     keys=("reward_mean", "eval_accuracy", "entropy", "len_mean", "absent"))
  assert plotted == ["reward_mean", "eval_accuracy", "entropy", "len_mean"]
  assert os.path.getsize(png) > 1000
  compare = str(tmp_path / "plots" / "compare.png")
  plotted = plot_compare({"dapo": os.path.join(run_a, "metrics.jsonl"),
                          "grpo": os.path.join(run_b, "metrics.jsonl")}, compare)
  assert plotted == ["reward_mean", "eval_accuracy", "entropy", "len_mean"]
  assert os.path.getsize(compare) > 1000
  empty = str(tmp_path / "empty.png")
  assert plot_run(os.path.join(run_a, "metrics.jsonl"), empty, keys=("absent",)) == []
  assert os.path.getsize(empty) > 0


def test_wall_clock_metrics_are_left_out_by_one_rule():
  record = {"step": 3, "loss": 0.5, "sec_step": 0.4, "sec_eval": 1.2, "weights/sync_sec": 0.01,
            "async/wait_sec": 0.2, "tokens_per_sec": 900.0, "eval_accuracy": 0.25,
            "sections": 2.0}
  assert metrics_lib.without_timing(record) == {"step": 3, "loss": 0.5, "eval_accuracy": 0.25,
                                                "sections": 2.0}

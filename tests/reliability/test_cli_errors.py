"""The command-line tools as a hostile new user meets them (issue 35's probes): every mistake is
one ``error: ...`` line with exit status 2 and no traceback; a refused resume or eval leaves the
run directory byte for byte as it was; what a study file gets wrong is named in one line."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from rljax import cli
from rljax import plan
from rljax.runs import run_dir as run_dir_lib
from rljax.sweep import runner
from rljax.train import evaluation
from tests.train import tiny

GRPO = os.path.join(tiny.ROOT, "configs", "algos", "grpo.py")
NOT_THERE = "/nonexistent-rljax-path"


def _one_line_error(argv, capsys) -> str:
  """Run the CLI in this process; assert exit status 2 and one ``error:`` line; return it."""
  capsys.readouterr()
  with pytest.raises(SystemExit) as info:
    cli.entry(argv)
  err = capsys.readouterr().err
  assert info.value.code == 2, err
  assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
  return err.strip()


# --- rljax plan --device ---------------------------------------------------------------------------

@pytest.mark.parametrize("device,expected", [
    ("0xh100", "device '0xh100': the count N of N x NAME 0 is not between 1 and"),
    ("99999999999999999999xh100",
     "device '99999999999999999999xh100': the count N of N x NAME 99999999999999999999 is not"),
    ("8x1e400GB", "unknown device '8x1e400GB'"),  # infinite memory (was an OverflowError)
    ("8x0", "unknown device '8x0'"),  # no memory at all (was planned with 0 bytes)
    ("8x1.2.3GB", "unknown device '8x1.2.3GB'"),
    ("h100:1e999", "device 'h100:1e999': cannot read memory"),
    ("v5p-0", "device 'v5p-0': v5p-N counts TensorCores, 2 per chip"),  # was one chip, silently
    ("v5p-1", "device 'v5p-1': v5p-N counts TensorCores, 2 per chip"),  # half a chip
    ("v5e-0", "device 'v5e-0': v5e-N counts chips: N must be at least 1"),
])
def test_plan_device_mistakes_are_one_line(device, expected, capsys):
  err = _one_line_error(["plan", "--config", GRPO, "--device", device], capsys)
  assert err.startswith("error: " + expected), err


def test_plan_devices_that_name_whole_chips_still_parse():
  assert plan.parse_device("v5p-8")["count"] == 4  # 8 TensorCores, 2 per chip
  assert plan.parse_device("v5e-1")["count"] == 1
  assert plan.parse_device("8x80GB")["bytes"] == 80 * 10 ** 9
  assert plan.parse_device("h100:1.5e10")["bytes"] == 15 * 10 ** 9


# --- flags and arguments of every command ----------------------------------------------------------

@pytest.mark.parametrize("argv,expected", [
    (["keys", "nope.nothing"], "rljax keys: no config key starts with 'nope.nothing'; sections: "),
    (["keys", "--bad"], "rljax keys: unrecognized arguments: --bad (see rljax keys --help)"),
    (["keys", "--markdown", "train."], "rljax keys --markdown prints the table of every key"),
    (["components", "extra"], "rljax components: unrecognized arguments: extra"),
    (["sft", "--config", GRPO, "junk"], "unexpected arguments ['junk']; sft takes --config"),
    (["convert", "run"], "rljax convert: the following arguments are required: out"),
    (["convert", NOT_THERE, NOT_THERE + "-out"], f"'{NOT_THERE}' is not an rljax run directory"),
    (["check-conversion"], "rljax check-conversion: the following arguments are required: path"),
    (["eval", "--config", GRPO, "--samples", "x"],
     "rljax eval: argument --samples: invalid int value: 'x'"),
    (["eval", "--config", GRPO, "--checkpoint", NOT_THERE],
     f"'{NOT_THERE}' is not an rljax run directory (no config.json)"),
    (["plan", "--config", GRPO, "--device"], "rljax plan: argument --device: expected one"),
    (["sweep"], "rljax sweep: the following arguments are required: study"),
    (["eval", "--config", GRPO, "--samples", str(10 ** 12)],  # was an int32 overflow traceback
     "eval --samples=1000000000000 is not allowed: expected an integer >= 1 and <= 65536"),
])
def test_bad_arguments_are_one_line(argv, expected, capsys):
  err = _one_line_error(argv, capsys)
  assert err.startswith("error: " + expected), err


def test_resume_override_naming_no_key_is_one_line(tmp_path, capsys):
  err = _one_line_error(tiny.args("grpo", str(tmp_path / "run"),
                                  {"train.resume_override": "('optim.lr','nokey','model')"}),
                        capsys)
  assert err.startswith("error: train.resume_override names ['nokey'], which are no config keys"), \
      err
  assert not os.path.exists(tmp_path / "run")


def test_convert_refuses_any_config_override(tmp_path, capsys):
  err = _one_line_error(["convert", str(tmp_path / "run"), str(tmp_path / "out"),
                         "--config.model.family=qwen3"], capsys)
  assert "rljax convert takes no --config or --config.KEY overrides" in err
  assert os.listdir(tmp_path) == []


# --- rljax sweep: study files and options ----------------------------------------------------------

_STUDY = """
from rljax.sweep.study import Study, independent
def get_study():
  return Study(name="s", config={config!r}, variants=independent([("a", {{}}), ("b", {{}})]),
               seeds={seeds}, metrics={metrics}, baseline={baseline!r}{extra})
"""
_GOOD = dict(config="configs/algos/grpo.py", seeds="(0, 1)", metrics="('final_accuracy',)",
             baseline="a", extra="")


@pytest.mark.parametrize("change,expected", [
    (dict(metrics="('final_acc',)"), "study 's': metrics ['final_acc'] are not summary metrics"),
    (dict(baseline="c"), "study 's': baseline 'c' is not a variant; variants: ['a', 'b']"),
    (dict(config="configs/nope.py"), "study config 'configs/nope.py' found neither relative"),
    (dict(seeds="(1, 1)"), "study 's': seeds must be distinct and non-empty, got (1, 1)"),
    (dict(seeds="('0', 1)"), "seed '0' (str) is not an integer"),
    (dict(seeds="3"), "study 's': variants and seeds must be sequences"),
    (dict(extra=", overrides={'seed': 3}"), "study 's': overrides sets ['seed'], which the sweep"),
    (dict(extra=", overrides={'optim.lr': object()}"), "override value <object object at"),
])
def test_study_mistakes_are_one_line(change, expected, tmp_path, capsys):
  path = tmp_path / "study.py"
  path.write_text(_STUDY.format(**dict(_GOOD, **change)))
  err = _one_line_error(["sweep", str(path), "--root", str(tmp_path / "runs"),
                         "--print-commands"], capsys)
  assert err.startswith("error: " + expected), err
  assert not os.path.exists(tmp_path / "runs")


def test_study_that_returns_no_study_is_one_line(tmp_path, capsys):
  path = tmp_path / "study.py"
  path.write_text("def get_study():\n  return {'name': 's'}\n")
  err = _one_line_error(["sweep", str(path)], capsys)
  assert err == f"error: {path}: get_study() must return rljax.sweep.study.Study, got dict"


@pytest.mark.parametrize("options,expected", [
    (["--parallel", "0"], "rljax sweep: --parallel must be >= 1, got 0"),
    (["--seeds", "5"], "--seeds [5] are not seeds of study 's'; its seeds: [0, 1]"),
    (["--seeds", "a"], "--seeds expects comma-separated integers, got 'a'"),
    (["--set", "x"], "rljax sweep: --set expects KEY=VALUE, got 'x'"),
    (["--set", "nokey.x=1"], "unknown config key 'nokey.x'"),
])
def test_sweep_option_mistakes_are_one_line(options, expected, tmp_path, capsys):
  path = tmp_path / "study.py"
  path.write_text(_STUDY.format(**_GOOD))
  err = _one_line_error(["sweep", str(path), "--root", str(tmp_path / "runs"), "--print-commands",
                         *options], capsys)
  assert err.startswith("error: " + expected), err


def test_sweep_root_that_cannot_be_created_is_one_line(tmp_path, capsys):
  path = tmp_path / "study.py"
  path.write_text(_STUDY.format(**_GOOD))
  (tmp_path / "file").write_text("x")
  err = _one_line_error(["sweep", str(path), "--root", str(tmp_path / "file")], capsys)
  assert err == (f"error: cannot create the study directory '{tmp_path}/file/s': Not a directory "
                 f"({tmp_path}/file/s); choose another --root")


def test_aggregating_a_study_with_no_finished_run_is_one_line(tmp_path, capsys):
  path = tmp_path / "study.py"
  path.write_text(_STUDY.format(**_GOOD))
  err = _one_line_error(["sweep", str(path), "--root", str(tmp_path / "runs"),
                         "--aggregate-only"], capsys)
  assert err == "error: study 's' has no finished run to aggregate"


# --- the sweep forwards SIGINT/SIGTERM to its runs --------------------------------------------------

_CHILD = """
import signal, sys, time
def on(signum, frame):
  print("got", signal.Signals(signum).name, flush=True)
  sys.exit(0)
signal.signal(signal.SIGINT, on if sys.argv[1] == "stop" else signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""


def _job(tmp_path, mode, name="job"):
  log = str(tmp_path / f"{name}.log")
  return runner.Job("job", (sys.executable, "-c", _CHILD, mode), log, None), log


def _signal_when_ready(log, signals):
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline and not (  # the line it prints once its handler is set
      os.path.exists(log) and "\nready\n" in open(log).read()):
    time.sleep(0.05)
  for signum in signals:
    os.kill(os.getpid(), signum)  # to this process, the sweep: as Ctrl-C or `kill -INT` would
    time.sleep(0.5)


@pytest.mark.parametrize("mode", ["stop", "ignore"])
def test_sweep_forwards_sigint_to_its_runs_and_a_second_one_kills_them(mode, tmp_path):
  job, log = _job(tmp_path, mode)
  signals = [signal.SIGINT] if mode == "stop" else [signal.SIGINT, signal.SIGINT]
  before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs as a background job
  sender = threading.Thread(target=_signal_when_ready, args=(log, signals))
  with runner.forwarding_signals():
    sender.start()
    result = runner.run_job(job)  # no KeyboardInterrupt here: the handler forwards the signal
    sender.join()
    assert runner.stop_signal() == signal.SIGINT
    # No job starts once the sweep is stopping.
    assert runner.run_job(_job(tmp_path, "stop", "later")[0])["returncode"] is None
  text = open(log).read()
  if mode == "stop":
    assert result["returncode"] == 0 and "\ngot SIGINT\n" in text
  else:  # it ignored the first one: the second is SIGKILL, to its whole process group
    assert result["returncode"] == -signal.SIGKILL and "\ngot SIGINT\n" not in text
  assert signal.getsignal(signal.SIGINT) is before  # restored
  # The stop belonged to that sweep: jobs run later in this process start.
  assert runner.stop_signal() is None
  after = runner.Job("after", (sys.executable, "-c", "pass"), str(tmp_path / "after.log"), None)
  assert runner.run_job(after)["returncode"] == 0


# --- SIGTERM before a training block has its own handler -----------------------------------------

def _catches_sigterm(pid: int) -> bool:
  """Whether the process has a handler for SIGTERM (/proc's SigCgt mask, bit 15 - 1)."""
  with open(f"/proc/{pid}/status") as f:
    mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
  return bool(mask >> (signal.SIGTERM - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_sigterm_during_start_up_is_one_line_and_143(tmp_path):
  """Was: exit 143 and nothing on stderr (killed while importing JAX, before any handler)."""
  run_dir = str(tmp_path / "run")
  argv = tiny.args("grpo", run_dir, {"reward.fn": "exact_match"})  # registered outside tests
  proc = subprocess.Popen([sys.executable, "-m", "rljax", *argv],
                          cwd=tiny.ROOT, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 60
  while not _catches_sigterm(proc.pid) and time.monotonic() < deadline:
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)  # the entry point's handler: JAX is still being imported
  err = proc.communicate(timeout=120)[1]
  assert proc.returncode == 128 + signal.SIGTERM, err
  assert err.strip().splitlines() == [
      "stopped (SIGTERM) outside the training loop (start-up or shutdown): no step was in "
      "flight"], err


# --- eval --checkpoint and train.resume_override against a real run dir ----------------------------

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A finished 2-step tiny GRPO run with its checkpoint (llama family)."""
  path = str(tmp_path_factory.mktemp("cli") / "run")
  cli.entry(tiny.args("grpo", path, {"train.eval_every": "0"}))
  return path


def _snapshot(path) -> dict:
  """``{relative path: sha256}`` of every file under ``path``."""
  out = {}
  for folder, _, files in os.walk(path):
    for name in files:
      full = os.path.join(folder, name)
      with open(full, "rb") as f:
        out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.mark.slow
@pytest.mark.parametrize("override,expected", [
    ({"model.family": "qwen3"}, "the keys ['model.family'] named in train.resume_override"),
    ({"model.intermediate_size": "48"}, "checkpoint shape (32, 64), this config's (32, 48)"),
])
def test_resume_override_that_changes_the_state_leaves_the_run_dir_untouched(
    run_dir, override, expected, capsys):
  before = _snapshot(run_dir)
  named = "('" + "','".join(override) + "',)"
  err = _one_line_error(tiny.args("grpo", run_dir, {"train.eval_every": "0", "train.resume": "True",
                                                    "train.steps": "3", **override,
                                                    "train.resume_override": named}), capsys)
  assert err.startswith(f"error: cannot resume {run_dir}: its checkpoint 2 holds another train "
                        "state than this config builds ("), err
  assert expected in err
  assert _snapshot(run_dir) == before  # config.json, data.json, checkpoints: byte for byte
  with open(os.path.join(run_dir, "config.json")) as f:
    assert json.load(f)["model"]["family"] == "llama"


@pytest.mark.slow
def test_eval_checkpoint_refuses_a_model_override_that_contradicts_it(run_dir, capsys):
  before = _snapshot(run_dir)
  err = _one_line_error(["eval", "--config", GRPO, "--checkpoint", run_dir,
                         "--config.model.family=qwen3"], capsys)
  assert err == (f"error: eval --checkpoint {run_dir}: --config.model.family='qwen3' contradicts "
                 "the checkpoint (its config.json has model.family='llama'): the model is the "
                 "checkpoint's; drop the override (an eval of a checkpoint sets only "
                 "model.{dtype, attention, attention_block, matmul_precision, scan_layers, "
                 "moe_dispatch, moe_capacity_factor})")
  assert _snapshot(run_dir) == before


@pytest.mark.slow
def test_eval_checkpoint_takes_the_sampler_settings_and_the_checkpoints_architecture(run_dir):
  from rljax.config import loader as config_loader
  overrides = [("model.attention", "xla"), ("model.hidden_size", "32"),
               ("model.num_layers", "1")]  # the last two agree with the checkpoint
  config = config_loader.load_config(GRPO, overrides)  # its own widths are the defaults
  merged = evaluation.checkpoint_config(config, run_dir, [k for k, _ in overrides])
  assert merged.model.attention == "xla"  # applied
  assert merged.model.intermediate_size == int(tiny.OVERRIDES["model.intermediate_size"])
  assert config.model.intermediate_size != merged.model.intermediate_size  # not the eval's


def test_sweep_study_file_is_refused_before_any_process_starts(tmp_path):
  """A subprocess run of a bad study: one line, exit 2, as the in-process probes."""
  path = tmp_path / "study.py"
  path.write_text(_STUDY.format(**dict(_GOOD, metrics="('nope',)")))
  proc = subprocess.run([sys.executable, "-m", "rljax", "sweep", str(path)], capture_output=True,
                        text=True, cwd=tiny.ROOT, env=dict(os.environ, PYTHONPATH=tiny.ROOT),
                        timeout=300)
  assert proc.returncode == 2
  assert proc.stderr.startswith("error: study 's': metrics ['nope'] are not summary metrics")
  assert proc.stderr.count("\n") == 1


# --- rljax convert: never a half-written model ------------------------------------------------------

@pytest.mark.slow
def test_convert_writes_the_model_or_nothing(run_dir, tmp_path, monkeypatch, capsys):
  from rljax import models
  out = tmp_path / "hf"
  real = models.save_hf

  def interrupted(path, *args, **kwargs):
    with open(os.path.join(path, "config.json"), "w") as f:
      f.write("{}")
    raise KeyboardInterrupt  # Ctrl-C while the weights are written
  monkeypatch.setattr(models, "save_hf", interrupted)
  with pytest.raises(SystemExit) as info:
    cli.entry(["convert", run_dir, str(out)])
  assert info.value.code == 130
  assert capsys.readouterr().err == "interrupted (SIGINT)\n"
  assert os.listdir(tmp_path) == []  # no OUT, no staging directory
  monkeypatch.setattr(models, "save_hf", real)
  (tmp_path / "file").write_text("x")
  err = _one_line_error(["convert", run_dir, str(tmp_path / "file" / "hf")], capsys)
  assert err.startswith(f"error: convert: cannot write the output '{tmp_path}/file/hf': ")
  os.remove(tmp_path / "file")
  cli.entry(["convert", run_dir, str(out)])
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  assert models.check_hf_dir(str(out)).num_layers == int(tiny.OVERRIDES["model.num_layers"])
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(out).st_mode & 0o777 == 0o777 & ~umask  # not the staging directory's 0700
  assert [n for n in os.listdir(tmp_path)] == ["hf"]
  # --force into a directory holding other files: the model's files written, the others kept.
  forced = tmp_path / "forced"
  forced.mkdir()
  (forced / "README.md").write_text("mine")
  cli.entry(["convert", run_dir, str(forced), "--force"])
  assert sorted(os.listdir(forced)) == ["README.md", "config.json", "model.safetensors"]
  assert models.check_hf_dir(str(forced)).num_layers == int(tiny.OVERRIDES["model.num_layers"])
  assert (forced / "README.md").read_text() == "mine"
  assert sorted(os.listdir(tmp_path)) == ["forced", "hf"]


def test_convert_force_onto_an_earlier_export_and_its_files_readable_as_config_json(run_dir,
                                                                                    tmp_path):
  """Was: `convert --force` onto an earlier export was refused as "a run directory" (its
  config.json read as a run's), and every safetensors file rljax writes was mode 0600 beside a
  0644 config.json (a serving account could read the config but not the weights). Under the
  umask 022 and 027 both are 0666 less the umask, like any file the process creates."""
  out = tmp_path / "hf"
  for mask in (0o022, 0o027):
    previous = os.umask(mask)
    try:
      cli.entry(["convert", run_dir, str(out)] + (["--force"] if out.exists() else []))
    finally:
      os.umask(previous)
    modes = {name: os.stat(out / name).st_mode & 0o777 for name in os.listdir(out)}
    assert modes == {"config.json": 0o666 & ~mask, "model.safetensors": 0o666 & ~mask}
  assert not run_dir_lib.holds_run(str(out))  # an export is not a run

"""configs/ composes one way: every file starts from another by its path under configs/
(``based_on``), and a job that runs another algorithm takes that preset's algorithm sections and
keeps its own update schedule (``swap_algorithm``)."""
import ast
import glob
import os

import ml_collections
import pytest

from rljax.config.loader import (UPDATE_SCHEDULE, based_on, config_path, load_config_file,
                                 swap_algorithm)
from rljax.errors import ConfigFileError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
KINDS = ("algos", "jobs", "studies", "tasks")


def _files():
  return sorted(glob.glob(os.path.join(CONFIGS, "*", "*.py")))


def _called(tree, name):
  return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == name
             for n in ast.walk(tree))


def test_every_config_file_is_in_a_kind_folder_and_starts_from_another_one_way():
  files = _files()
  assert {os.path.basename(os.path.dirname(f)) for f in files} == set(KINDS)
  assert glob.glob(os.path.join(CONFIGS, "*.py")) == [os.path.join(CONFIGS, "base.py")]
  for path in files:
    tree = ast.parse(open(path).read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    assert "importlib" not in imported and "importlib.util" not in imported, path
    assert not imported & {"load_config_file", "call_file_function", "os"}, path
    assert _called(tree, "based_on"), f"{path} does not start from another config"


def _flat(config, prefix=""):
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


@pytest.mark.parametrize("job, base, preset, sections", [
    ("jobs/main_600_grpo.py", "jobs/main_600.py", "algos/grpo.py", ("algo", "reward")),
    ("jobs/main_600_dr_grpo.py", "jobs/main_600.py", "algos/dr_grpo.py", ("algo", "reward")),
    ("studies/arith_l1_ppo.py", "studies/arith_l1_grpo.py", "algos/ppo.py",
     ("algo", "critic", "reward")),
])
def test_a_job_with_another_algorithm_differs_from_its_base_only_there(job, base, preset,
                                                                        sections):
  """Each key of the job is the preset's in the swapped sections, the base job's everywhere else
  and in the update schedule, read from the three files loaded on their own."""
  got = _flat(load_config_file(config_path(job)))
  want_base = _flat(load_config_file(config_path(base)))
  want_algo = _flat(load_config_file(config_path(preset)))
  own = {"train.run_dir", "data.num_eval", "critic.lr"}  # what the job file sets itself
  swapped = [k for k in got if k.split(".")[0] in sections and k not in UPDATE_SCHEDULE
             and k not in own]
  assert any(want_algo[k] != want_base[k] for k in swapped)  # the swap changes something
  assert any(want_algo[k] != want_base[k] for k in UPDATE_SCHEDULE)  # and the keep binds
  for key, value in got.items():
    if key in own:
      continue
    want = want_algo if key in swapped else want_base
    assert value == want[key], key


def test_swap_algorithm_keeps_the_update_schedule_of_the_job():
  job = based_on("jobs/main_600.py")
  minibatches = job.algo.minibatches
  swapped = swap_algorithm(job, "algos/dapo.py")
  assert swapped.algo.minibatches == minibatches != based_on("algos/dapo.py").algo.minibatches
  assert swapped.algo.dynamic_sampling and swapped.rollout.group_size == job.rollout.group_size


def test_based_on_names_a_file_under_configs_and_locks_it():
  c = based_on("algos/grpo.py")
  with pytest.raises(AttributeError):
    c.algo.no_such_key = 1  # locked: a misspelt key is an error
  with pytest.raises(ConfigFileError, match="algos/, jobs/, studies/ and tasks/"):
    based_on("grpo.py")
  with pytest.raises(ConfigFileError, match="by its path under configs/"):
    based_on(os.path.join(CONFIGS, "algos", "grpo.py"))
  assert based_on().to_dict() == load_config_file(os.path.join(CONFIGS, "base.py")).to_dict()

"""docs/algorithms.md is generated from the registered components and kept in step; every
algorithm component it lists carries its formula and its paper."""
import inspect
import os
import re
import subprocess
import sys

from rljax import catalogue
from rljax import registries
from rljax.transforms import TRANSFORMS
from tests.train import tiny

PATH = os.path.join(tiny.ROOT, "docs", "algorithms.md")
PAPER = re.compile(r"\b\d{4}\.\d{4,5}\b|\b20[12]\d\b")  # an arXiv id or a year of publication
FORMULA = re.compile(r"`[^`]*(=|<-)[^`]*`")  # an equation or an update in a code span


def test_docs_algorithms_is_generated_from_the_components():
  # A fresh process: other tests register notebook components into this one's registries.
  env = dict(os.environ, PYTHONPATH=tiny.ROOT)
  fresh = subprocess.run([sys.executable, "-m", "rljax", "components", "--markdown"], env=env,
                         cwd=tiny.ROOT, capture_output=True, text=True, check=True).stdout
  with open(PATH) as f:
    assert f.read() == fresh, (
        "docs/algorithms.md is stale: python -m rljax components --markdown > docs/algorithms.md")


def test_every_registered_name_has_its_section():
  text = catalogue.markdown()
  for family, names in catalogue.families().items():
    for name in names:
      assert catalogue.heading(family, name) in text, (family, name)
  assert [s.title for s in catalogue.SECTIONS] == re.findall(r"^## (\d.*)$", text, re.M)


def _docs_of_algorithm_components():
  for family in ("advantage", "policy_loss", "kl_estimator", "regularizer"):
    reg = registries.family(family)
    for name in reg.names():
      yield f"{family} {name}", inspect.getdoc(reg.get(name)) or ""
  for name in TRANSFORMS.names():
    yield f"transform {name}", inspect.getdoc(TRANSFORMS.get(name)) or ""


def test_every_algorithm_component_states_its_formula_and_paper():
  missing = [(what, need) for what, doc in _docs_of_algorithm_components()
             for need, pattern in (("paper", PAPER), ("formula", FORMULA))
             if not pattern.search(doc)]
  assert not missing, missing


def test_the_async_correction_modes_are_documented_by_name():
  text = catalogue.markdown()
  section = text[text.index("### transform `rollout_correction`"):]
  for phrase in ("`truncate`", "`mask`", "TIS", "AReaL", "2505.24298", "rollout_is_over_cap"):
    assert phrase in section, phrase

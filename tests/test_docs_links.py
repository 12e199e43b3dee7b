"""The project's pages point at files that exist: every relative link of a markdown page, and
every repository path a page, config, study, script, benchmark or module names (``configs/...py``,
``docs/...md``, ``experiments/...py``, ...), so that moving a file cannot leave a stale pointer."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A repository path named in text: a top-level folder of the repository, then a file name with a
# suffix. Templates (``configs/algos/<algo>.py``, ``claim_*``, ``{a,b}``) are not paths.
ROOTS = ("configs", "docs", "experiments", "benchmarks", "scripts", "notebooks", "tests", "rljax")
PATH = re.compile(r"(?<![\w./<*{-])((?:%s)/[\w./+-]*\.(?:py|md|png|csv|sh|ipynb|json))(?![\w/*{<])"
                  % "|".join(ROOTS))


def _tracked(*suffixes):
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
  return [f for f in files if f.endswith(suffixes) and os.path.isfile(os.path.join(ROOT, f))]


def _anchor(heading: str) -> str:
  """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as '-'."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
  text = open(path, encoding="utf-8").read()
  return {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def _broken_links(page):
  text = open(os.path.join(ROOT, page), encoding="utf-8").read()
  broken = []
  for link in LINK.findall(text):
    target, _, anchor = link.partition("#")
    if re.match(r"^[a-z]+:", target):
      continue
    path = os.path.join(ROOT, os.path.dirname(page), target) if target else os.path.join(ROOT, page)
    if not os.path.exists(path):
      broken.append(link)
    elif anchor and path.endswith(".md") and anchor not in _anchors(path):
      broken.append(link)
  return broken


def test_markdown_links_resolve():
  broken = {page: b for page in _tracked(".md") if (b := _broken_links(page))}
  assert not broken, f"links to files that do not exist: {broken}"


def _named_paths(f):
  """The repository paths that ``f`` names and a reader would open or run. A results page is a
  record of its day: the code files it names (``rljax/...``) may have moved since."""
  text = open(os.path.join(ROOT, f), encoding="utf-8").read()
  # A link's target is relative to its page (test_markdown_links_resolve checks it); its text
  # and the prose around it name repository paths.
  paths = set(PATH.findall(LINK.sub("]()", text)))
  if f.startswith("docs/results/"):
    paths = {p for p in paths if not p.startswith("rljax/")}
  return paths


def test_named_repository_paths_exist():
  """Tests are left out: they name paths that must not exist (a missing config's error)."""
  missing = {}
  for f in _tracked(".md", ".py", ".sh", ".ipynb"):
    if f.startswith("tests/"):
      continue
    gone = sorted(p for p in _named_paths(f) if not os.path.exists(os.path.join(ROOT, p)))
    if gone:
      missing[f] = gone
  assert not missing, f"paths named that do not exist: {missing}"


def test_the_checks_see_a_stale_pointer(tmp_path):
  """The patterns catch what they are for (a moved results page, a renamed config)."""
  assert PATH.findall("see docs/results/main_job.md and `configs/jobs/main_600_grpo.py`.") == [
      "docs/results/main_job.md", "configs/jobs/main_600_grpo.py"]
  assert PATH.findall("configs/algos/<algo>.py, claim_*.py, runs/main/hf") == []
  assert LINK.findall("[a](b/c.md#x) and [d](https://e)") == ["b/c.md#x", "https://e"]
  assert _anchor("Row chunks in the update (`model.forward_tokens`, 2026-11-26 ~10:00 UTC)") == (
      "row-chunks-in-the-update-modelforward_tokens-2026-11-26-1000-utc")


def test_the_docs_index_lists_every_page():
  index = os.path.join(ROOT, "docs", "index.md")
  linked = {os.path.normpath(os.path.join(ROOT, "docs", t.split("#")[0]))
            for t in LINK.findall(open(index, encoding="utf-8").read())}
  pages = {os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
           if f.endswith(".md") and f != "index.md"}
  pages.add(os.path.join(ROOT, "docs", "results", "README.md"))
  assert not pages - linked, f"docs/index.md does not list {sorted(pages - linked)}"

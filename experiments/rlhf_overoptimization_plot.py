"""The over-optimisation figure of a run study (experiments/studies/rlhf_overoptimization.py):
the proxy reward (``reward/rm``) and the gold reward (``reward/gold``) against the KL from the
initial policy, each variant's seed mean with its 95% t-band (``rljax.sweep.plots``).

  python experiments/rlhf_overoptimization_plot.py runs/studies/rlhf_overoptimization [OUT.png]

A single run (``configs/tasks/rlhf.py`` alone) draws its own ``rewards_vs_kl.png`` in its run dir.
"""
import os
import sys

from rljax.sweep.plots import plot_overoptimization
from rljax.runs.metrics import read_jsonl


def study_records(root: str) -> dict:
  """``{(variant, seed): records}`` of every ``<root>/<variant>/seed<k>/metrics.jsonl``."""
  out = {}
  for variant in sorted(os.listdir(root)):
    for run in sorted(os.listdir(os.path.join(root, variant))) if os.path.isdir(
        os.path.join(root, variant)) else ():
      path = os.path.join(root, variant, run, "metrics.jsonl")
      if run.startswith("seed") and os.path.isfile(path):
        out[(variant, int(run[4:]))] = read_jsonl(path)
  return out


def main(argv):
  root = argv[0]
  out = argv[1] if len(argv) > 1 else os.path.join(root, "overoptimization.png")
  records = study_records(root)
  variants = sorted({name for name, _ in records})
  plot_overoptimization(records, variants, out, title=os.path.basename(root.rstrip("/")))
  print(out)


if __name__ == "__main__":
  main(sys.argv[1:])

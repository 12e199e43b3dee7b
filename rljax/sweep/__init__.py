"""Ablation studies: variants x seeds of one config, run resumably and compared with intervals.

``python -m rljax sweep experiments/studies/<study>.py`` (rljax.sweep.sweep); study files:
rljax.sweep.study; running: rljax.sweep.runner; statistics: rljax.sweep.aggregate; plots:
rljax.sweep.plots. Method and study list: docs/ablations.md.
"""

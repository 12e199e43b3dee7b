"""Base configuration: every key of docs/config.md with its default.

The defaults live in the installed package (``rljax/config/table.py``, also ``rljax.config()``), so
that a notebook outside this repository gets the same config. Presets (``configs/algos/<algo>.py``)
start from ``get_config()`` here and change only what makes them that algorithm.
"""
from rljax.config.table import get_config  # noqa: F401

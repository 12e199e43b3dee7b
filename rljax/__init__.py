"""rljax: reinforcement-learning post-training of language models in JAX/Flax.

An algorithm is a configuration, not a class: see ``configs/`` and ``rljax.algos``. The short
public API (``rljax.config``, ``rljax.load``, ``rljax.Model``) is in ``rljax.config`` and
``rljax.api``; importing ``rljax`` itself stays cheap (the CLI sets XLA flags before JAX starts).
"""
__version__ = "0.1.0"

_API = ("Model", "load")


def __getattr__(name):
  if name in _API:
    from rljax import api
    return getattr(api, name)
  if name in ("algos", "algorithm", "config"):
    import importlib
    return importlib.import_module(f"rljax.{name}")
  raise AttributeError(f"module 'rljax' has no attribute {name!r}")

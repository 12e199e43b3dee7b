"""rljax: reinforcement-learning post-training of language models in JAX/Flax.

An algorithm is a configuration, not a class: see ``configs/`` and ``rljax.algos``.
"""
__version__ = "0.1.0"

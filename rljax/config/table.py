"""Every config key, declared once: default, allowed values, when it is read, what it changes,
which commands read it, one line of doc. The keys are declared by section in
``rljax/config/sections/`` (model, data, rollout, reward and env, algo with teacher, critic and
optim, run: seed, train, sft, rm, mesh, dist); ``KEYS`` here is the one list everything reads.

``rljax.config()`` / ``get_config()`` builds the default ConfigDict from ``KEYS``;
``rljax.config.checks`` checks every value against its declaration at start-up, refuses a key set
away from its default that nothing reads, and checks ``RELATIONS``; ``rljax keys`` prints them and
``docs/config.md`` is generated from them (``python -m rljax keys --markdown``). A preset
(``configs/algos/<algo>.py``) changes only what makes that algorithm. Override anything on the
command line with ``--config.section.key=value``.

The format (``rljax.config.declare``), one line per fact::

  Key("section.name", default, check, "one line of doc"[, read_if=WHEN][, effect=...]
      [, commands=reads(...)])

- ``check``: what the value may be: ``BOOL``, ``SIZE``, ``integer(lo, hi)``, ``real(lo, hi)``,
  ``choice(...)``, ``registered("advantage")`` (a registered component), ``optional(...)``.
  Components take a choice key's values from here (``options("model.router_replay")``).
- ``read_if``: when the run reads the key (default ``ALWAYS``). A key whose condition is false
  must keep its default, or the run stops naming it and the reason (``When.unless``). Conditions:
  ``equals(key, v)``, ``differs(key, v)``, ``above(key, v)``, ``meta_says(key, test, says)`` (the
  component a key names declares something), ``component_reads()`` (an ``algo.*``
  hyperparameter, read when a resolved component binds it: its registration names the key), the
  named ones (``CRITIC``, ``MULTI_TURN``, ...), combined with ``&`` and ``|``.
  The named conditions are in ``rljax.config.conditions``.
- ``effect`` (``rljax.config.declare.EFFECTS``): what a different value changes: ``RESULT`` (the
  default: the numbers the run produces), ``EXTENT`` (how far it trains), ``MEASURE`` (only what
  is evaluated), ``LAYOUT`` (how the same numbers are computed: sharding, chunking, caches,
  workers) or ``BOOKKEEPING`` (paths, logging, progress). Which keys a resume may change, which a
  sweep compares and what the SFT cold start's stamp holds follow from it
  (``rljax.config.effects``).
- ``commands``: the commands that read the key, and when: ``reads("train", "eval",
  sft=WHEN)``; default: the RL run's (``train``, ``eval``, ``plan``). A ``--config.KEY``
  override for a command that does not read the key is refused (``rljax <command> --help`` lists
  the keys a command reads).
- Constraints between keys are ``Relation``s in ``RELATIONS`` (``rljax.config.relations``).

The config package sits at the bottom of rljax (it imports nothing else of it): models and
components read their choices from this table, and it registers nothing by being read.
"""
from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from rljax.config.declare import declare
from rljax.config.sections import algo, data, model, reward, rollout, run
from rljax.config.sections.algo import OLD_LOGP_SOURCES, ROLLOUT_LEVELS  # noqa: F401
from rljax.config.sections.common import DTYPES, STRING_TUPLE  # noqa: F401
from rljax.config.sections.data import CHAR_TOKENIZERS  # noqa: F401
from rljax.config.sections.model import (AUTO_PACK_MIN_CHUNKS, AUTO_PACK_PLATFORMS,  # noqa: F401
                                         CAPACITY_UNPACKED, LORA_TARGETS, MODEL_DIM, REMAT_MODES)
from rljax.config.sections.run import MESH_AXES, MESH_AXIS  # noqa: F401

# The order of docs/config.md: the run's seed first, then the sections as a run meets them.
KEYS = declare(run.SEED_KEY + model.KEYS + data.KEYS + rollout.KEYS + reward.KEYS + algo.KEYS
               + run.KEYS)

KEY_BY_NAME = {key.name: key for key in KEYS}


def options(name: str) -> tuple:
  """The values a choice key allows (components check direct calls against the declaration)."""
  return KEY_BY_NAME[name].check.options


def get_config() -> ml_collections.ConfigDict:
  """The default configuration: every key of ``KEYS`` with its default."""
  config = ml_collections.ConfigDict()
  for key in KEYS:
    *sections, leaf = key.name.split(".")
    node = config
    for section in sections:
      if section not in node:
        node[section] = ml_collections.ConfigDict()
      node = node[section]
    node[leaf] = placeholder(key.check.type) if key.default is None else key.default
  return config

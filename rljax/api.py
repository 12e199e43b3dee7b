"""The short public API for notebooks and scripts.

  import rljax
  config = rljax.config()                                  # the defaults, from the package
  config = rljax.config("configs/algos/grpo.py", {"rollout.group_size": 4})
  model = rljax.load("tiny")                               # or "hf:/path", or a run directory
  rollout, texts = model.sample(["1+2="], group_size=4)    # stops at the tokenizer's EOS
  logp, entropy = model.logprobs(rollout)                  # [B, T] each
  algo = rljax.algorithm.resolve(config)                       # pure functions, bound
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rljax.config import load as config
from rljax.data import tokenizer as tokenizer_lib
from rljax.models import ModelConfig, transformer
from rljax.registries import ROLLOUT_ENGINES
from rljax.rollout import engines, text
from rljax.rollout.sampler import Rollout, SamplingParams
from rljax.loading import loader
from rljax.learner import step




@functools.partial(jax.jit, static_argnums=0)
def _hidden(cfg: ModelConfig, params, tokens, mask):
  return transformer.forward(cfg, params, tokens, mask)


@functools.partial(jax.jit, static_argnums=0)
def _head(cfg: ModelConfig, params, hidden):
  return transformer.bind(cfg, params).logits(hidden).astype(jnp.float32)


@dataclasses.dataclass
class Model:
  """A policy with its tokenizer: ``logits``, ``sample`` and ``logprobs`` on plain inputs.
  ``engine``: the registered rollout engine ``sample`` uses (``rollout.engine``'s choices), on
  one device with the default ``rollout`` settings."""
  cfg: ModelConfig
  params: Any
  tokenizer: Any
  engine: str = "all_rows"

  def logits(self, tokens, mask=None, chunk: int = 512) -> np.ndarray:
    """Logits ``[B, S, V]`` (float32, on the host) of left-padded ``tokens [B, S]`` (``mask`` 1
    on real tokens): one forward, then the head ``chunk`` positions at a time, so the device
    holds ``[B, chunk, V]`` logits at most, as the trainer's log-prob head does."""
    tokens = jnp.asarray(tokens)
    mask = (tokens != self.tokenizer.pad_id) if mask is None else jnp.asarray(mask)
    hidden = _hidden(self.cfg, self.params, tokens, mask.astype(jnp.int32))
    return np.concatenate([np.asarray(_head(self.cfg, self.params, hidden[:, i:i + chunk]))
                           for i in range(0, tokens.shape[1], chunk)], axis=1)

  def sample(self, prompts: Sequence[str], *, group_size: int = 1, max_new_tokens: int = 64,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
             seed: int = 0, bucket: int = 16) -> tuple[Rollout, list[str]]:
    """``group_size`` completions per prompt (groups contiguous), each stopping at the
    tokenizer's EOS as ``generate`` does: the ``Rollout`` record and the decoded texts."""
    sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy,
                        max_new_tokens=max_new_tokens, stop_ids=(self.tokenizer.eos_id,),
                        pad_id=self.tokenizer.pad_id)
    tokens, mask, sp = text.text_prompts(self.cfg, self.tokenizer, list(prompts), sp, bucket)
    sampler = self.rollout_engine()
    sampler.load_weights(self.params, 0)
    rollout = sampler.generate(tokens, mask, jax.random.PRNGKey(seed), sp, group_size)
    return rollout, [self.tokenizer.decode(c) for c in text.completion_ids(rollout)]

  def rollout_engine(self) -> engines.RolloutEngine:
    """The registered engine ``self.engine`` for this model, on one device (no mesh)."""
    settings = config(overrides={"rollout.engine": self.engine})
    return ROLLOUT_ENGINES.get(self.engine)(settings, self.cfg, engines.Placement())

  def logprobs(self, rollout: Rollout, chunk: int = 512) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log-probs of a rollout's completion tokens and the full-vocabulary
    entropies at each position: ``([B, T], [B, T])``."""
    return step.completion_stats(self.cfg, self.params, rollout, chunk)


def load(source: str = "tiny", *, tokenizer: str | None = None,
         model_config: ml_collections.ConfigDict | None = None, seed: int = 0,
         dtype: str = "auto", param_dtype: str = "float32") -> Model:
  """A ``Model`` from ``source``:

  - ``"tiny"``: a fresh random Llama of the default (or given ``model_config``) sizes with the
    character tokenizer of the embedded tasks;
  - ``"hf:PATH"`` or a Hugging Face directory: its weights (safetensors) and, if the directory
    has one, its tokenizer;
  - an rljax run directory (``train.run_dir``, or ``"run:DIR"``): the latest checkpoint's
    policy; ``"run:DIR@STEP"``: checkpoint ``STEP``'s.

  The forms are ``rljax.config.sources``'s (and 'sft': ``sft.out_dir``), read by
  ``rljax.loading`` (role 'load'); anything else is a one-line ``StartupError``.

  ``dtype``: the compute dtype ('auto': bfloat16 on GPUs/TPUs, float32 on CPU); ``param_dtype``:
  the weights' (float32 master weights by default).
  """
  settings = config(overrides={"seed": seed, "model.dtype": dtype,
                                "model.param_dtype": param_dtype})
  if model_config is not None:
    with settings.unlocked():
      # As plain values: a placeholder key (e.g. model.lora.init_from) is a FieldReference in
      # both, and ml_collections refuses to update one reference from another.
      settings.model.update(_plain(model_config))
  parsed = loader.source_of(settings, "load", source)
  if parsed.kind in ("hf", "run") and not os.path.isdir(parsed.path):
    raise FileNotFoundError(f"rljax.load: {source!r}: {parsed.path!r} is not a directory")
  asked = tokenizer_lib.load_tokenizer(tokenizer or "char") if parsed.kind == "tiny" else tokenizer
  loaded = loader.load(settings, "load", asked, text=source)
  return Model(loaded.cfg, loaded.params, loaded.tokenizer)


def _plain(section):
  """A config section (or mapping) as nested plain dicts of its values."""
  return section.to_dict() if hasattr(section, "to_dict") else dict(section)

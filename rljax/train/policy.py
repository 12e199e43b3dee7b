"""The policy a run starts from and the frozen models it scores with, read by
``rljax.loading``: the 'sft' cold start trained first when missing, the base of a policy with
adapters pinned at the start (``rljax.loading.pin``), the transforms' frozen models placed on
the learner's mesh."""
from __future__ import annotations

import jax

from rljax.algorithm import Algorithm
from rljax.config.sources import ModelSource
from rljax.learner.initial import param_sharding
from rljax.loading import loader, pin
from rljax.models import ModelConfig, lora
from rljax.train import sft
from rljax.train.startup import model_source


def load_policy(config, tokenizer, *, init_from: bool = True, base: str | None = None
                ) -> tuple[ModelConfig, dict]:
  """``model.source`` read by ``rljax.loading`` (``base``: the pinned source of a resumed run
  with adapters), the 'sft' cold start trained first when ``sft.out_dir`` does not hold it yet.
  With ``model.lora.rank`` > 0 the source is the frozen base and fresh adapters join it (B = 0),
  or ``model.lora.init_from``'s (unless ``init_from=False``: adapters from a checkpoint)."""
  if model_source(config).kind == "sft":
    sft.ensure_sft_checkpoint(config, tokenizer)
  return loader.policy(config, tokenizer, with_init_from=init_from, base=base)


def load_run_params(run_dir: str, config=None, step: int | None = None, *,
                    merged: bool = True):
  """(ModelConfig, policy params) of checkpoint ``step`` of the run in ``run_dir`` (None: its
  latest): ``rljax.loading.loader.read_run`` of ``run:DIR[@STEP]``."""
  text = f"run:{run_dir}" + ("" if step is None else f"@{step}")
  return loader.read_run(ModelSource("run", run_dir, step, text), config, merged=merged,
                         who=text)


def pinned_policy(config, tokenizer, resuming: bool):
  """(ModelConfig, params, the adapters' base record or None): the policy, its base with adapters
  pinned at the start (a 'run:DIR' source at the step it reads now) and read at that pin on a
  resume (``rljax.loading.pin``)."""
  if not config.model.lora.rank:
    return (*load_policy(config, tokenizer, init_from=not resuming), None)
  record = pin.read(config.train.run_dir) if resuming else None
  source, step = model_source(config), None
  if record is None and source.kind == "run":
    step = loader.run_step(source, f"model.source={source.text!r}")
  base = pin.pinned_source(config, record or {"step": step})
  model_cfg, params = load_policy(config, tokenizer, init_from=not resuming, base=base)
  frozen = lora.split_adapters(params)[0]
  if record is not None:
    pin.check_fingerprint(record, frozen, config.model.source)
    return model_cfg, params, record
  return model_cfg, params, pin.base_record(config, step, frozen if step is not None else None)


def load_aux_models(config, algo: Algorithm, tokenizer, model_cfg: ModelConfig, mesh):
  """The transforms' frozen models (``Transform.aux_role``, read by ``rljax.loading``):
  ``((name, ModelConfig), ...)`` and ``{name: params placed by the partition rules}`` (empty
  when no transform has one)."""
  cfgs, params = [], {}
  for t in algo.transforms:
    if t.aux_role is not None:
      loaded = loader.load(config, t.aux_role, tokenizer, policy_cfg=model_cfg)
      cfgs.append((t.name, loaded.cfg))
      params[t.name] = jax.device_put(loaded.params, param_sharding(mesh, loaded.cfg))
  return tuple(cfgs), params

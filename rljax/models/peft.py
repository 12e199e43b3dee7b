"""LoRA adapters in the format of Hugging Face PEFT: a directory holding
``adapter_model.safetensors`` and ``adapter_config.json`` that
``peft.PeftModel.from_pretrained(transformers_base, path)`` loads, written from rljax adapters and
read back into them.

Names and layouts. An adapted ``transformers`` module ``M`` (tensor ``model.layers.3.mlp.up_proj
.weight`` [out, in]) has PEFT tensors ``base_model.model.M.lora_A.weight`` [r, in] and
``base_model.model.M.lora_B.weight`` [out, r]; its update is ``W + (alpha / r) B A``. rljax stores
the kernel [in, out] (the transpose of ``weight``) and beside it ``lora_a`` [in, r] and ``lora_b``
[r, out] (``rljax.models.lora``): each factor is the transpose of PEFT's. Stacked MoE expert kernels
[E, in, out] have ``<proj>_lora_a`` [E, in, r] and ``<proj>_lora_b`` [E, r, out]; expert ``e`` is
PEFT's module ``model.layers.L.mlp.experts.e.<proj>`` (the per-expert layout of Qwen3-MoE
checkpoints, which ``peft`` fuses itself when the ``transformers`` model stores its experts
fused). The Hugging Face names come from the family's tensor map (``rljax.models.hf``), so every
family and the experts share one mapping; PEFT names modules by the ``transformers`` model's
module tree, which for some families differs from the checkpoint's names (Qwen2.5-VL:
``model.language_model.layers.N`` for ``model.layers.N``; ``Family.module_name``). A model with a
vision tower gets ``target_modules`` as a regular expression over its language model's layers:
the tower's projections share the names (``target_modules``).

No import of ``peft`` or ``torch``: the files are plain safetensors and JSON.
"""
from __future__ import annotations

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from rljax.errors import ModelFileError
from rljax.models import families, hf, lora, transformer
from rljax.models.config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."  # PeftModel wraps the LoRA model, which wraps the causal LM
FACTORS = {lora.A: "lora_A", lora.B: "lora_B"}  # rljax leaf (suffix) -> PEFT module name

# adapter_config.json options that change the arithmetic (or the base) in ways rljax does not
# implement: key -> (the values rljax reads, what the option is). An absent key is PEFT's default.
_OPTIONS = {
    # peft's format for experts fused into one parameter (transformers >= 5): gate and up share
    # one factor pair of rank 2r, which rljax's rank-r gate_proj and up_proj factors cannot hold
    "target_parameters": ((None, []), "LoRA on fused expert parameters, rank 2r on gate_up_proj"),
    "use_rslora": ((False,), "rank-stabilised scaling alpha/sqrt(r)"),
    "use_dora": ((False,), "DoRA's magnitude vectors"),
    "bias": (("none",), "trained biases"),
    "lora_bias": ((False,), "a bias on lora_B"),
    "fan_in_fan_out": ((False,), "Conv1D-layout weights"),
    "modules_to_save": ((None, []), "fully trained extra modules"),
    "rank_pattern": ((None, {}), "per-module ranks"),
    "alpha_pattern": ((None, {}), "per-module alphas"),
    "layers_to_transform": ((None, []), "adapters on some layers only"),
    "exclude_modules": ((None, [], ""), "modules excluded from the targets"),
    "layer_replication": ((None, []), "replicated layers"),
    "trainable_token_indices": ((None, {}, []), "trained embedding rows"),
    "use_qalora": ((False,), "QA-LoRA's pooled inputs"),
    "use_bdlora": ((None, False), "block-diagonal LoRA"),
    "alora_invocation_tokens": ((None, []), "activated LoRA"),
    "velora_config": ((None,), "VeLoRA"),
    "kasa_config": ((None,), "KaSA"),
    "arrow_config": ((None,), "Arrow routing"),
    "monteclora_config": ((None,), "MonteCLoRA"),
    "megatron_config": ((None,), "Megatron-parallel layers"),
    # inits that rewrite the base weights (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA) need that
    # rewritten base: with the original base the adapter means something else
    "init_lora_weights": ((True, False, "gaussian", "eva"), "an init that rewrites the base "
                          "weights"),
}
_TASKS = (None, "CAUSAL_LM")


def kernel_path(path: tuple) -> tuple[tuple, str]:
  """(the base kernel's param path, 'lora_a' | 'lora_b') of an adapter leaf: ``(..., 'q_proj',
  'lora_a')`` adapts ``(..., 'q_proj', 'kernel')``; ``(..., 'mlp', 'up_proj_lora_b')`` adapts
  the stacked experts ``(..., 'mlp', 'up_proj')``."""
  leaf = path[-1]
  if leaf in FACTORS:
    return path[:-1] + ("kernel",), leaf
  for factor in FACTORS:
    if leaf.endswith("_" + factor):
      return path[:-1] + (leaf[:-len(factor) - 1],), factor
  raise KeyError(f"{'/'.join(map(str, path))} is not a LoRA factor (lora_a / lora_b)")


def adapter_path(kernel: tuple, factor: str) -> tuple:
  """Inverse of ``kernel_path``."""
  if kernel[-1] == "kernel":
    return kernel[:-1] + (factor,)
  return kernel[:-1] + (f"{kernel[-1]}_{factor}",)


def peft_names_of(cfg: ModelConfig, path: tuple) -> list[tuple[str, int | None]]:
  """The PEFT tensors of one adapter leaf: (name, expert index or None), one per expert for
  stacked experts."""
  kernel, factor = kernel_path(path)
  module = families.get(cfg.model_type).module_name
  out = []
  for name, transpose, index in hf.hf_names_of(cfg, kernel):
    if not (transpose and name.endswith(".weight")):
      raise KeyError(f"{name} is not a linear layer's weight: LoRA does not adapt it")
    out.append((f"{PREFIX}{module(name)[:-len('.weight')]}.{FACTORS[factor]}.weight", index))
  return out


def module_name(hf_name: str) -> str:
  """PEFT's target-module name of an HF tensor: ``model.layers.0.self_attn.q_proj.weight`` ->
  ``q_proj``."""
  return hf_name.rsplit(".", 2)[-2]


def _parse_name(name: str) -> tuple[str, str] | None:
  """(the adapted HF weight's name, 'lora_a' | 'lora_b') of a PEFT tensor name, None if it is
  no LoRA factor of a module's weight."""
  if not name.startswith(PREFIX):
    return None
  for factor, peft_factor in FACTORS.items():
    suffix = f".{peft_factor}.weight"
    if name.endswith(suffix):
      return name[len(PREFIX):-len(suffix)] + ".weight", factor
  return None


def target_modules(cfg: ModelConfig, targets) -> list | str:
  """PEFT's ``target_modules`` of adapters on the projections ``targets``: the names, which PEFT
  matches as suffixes of every module; for a model with a vision tower, whose blocks have
  projections of the same names (``gate_proj``, ...), a regular expression that PEFT matches
  against the language model's layers only."""
  names = sorted(targets)
  if cfg.vision is None:
    return names
  layers = families.get(cfg.model_type).module_name("model.layers.")
  return rf"{re.escape(layers)}\d+\..*\.({'|'.join(names)})"


def adapter_config(cfg: ModelConfig, targets, base_model: str | None) -> dict:
  """``adapter_config.json`` of rljax adapters: plain LoRA (scale alpha / r) on the projections
  ``targets`` of every layer of ``base_model`` (a Hugging Face directory or hub name)."""
  return {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
      "r": int(cfg.lora_rank), "lora_alpha": _number(cfg.lora_alpha),
      "target_modules": target_modules(cfg, targets), "lora_dropout": 0.0, "bias": "none",
      "lora_bias": False, "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
      "init_lora_weights": True, "modules_to_save": None, "layers_to_transform": None,
      "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "inference_mode": True,
      "revision": None}


def _number(x):
  return int(x) if float(x).is_integer() else float(x)


def save_peft_adapter(path: str, cfg: ModelConfig, adapters: dict,
                      base_model: str | None) -> None:
  """Write ``adapters`` (the adapter tree of ``rljax.models.lora.split_adapters``) as a PEFT LoRA
  directory of ``base_model`` (its ``base_model_name_or_path``), in the adapters' dtype."""
  os.makedirs(path, exist_ok=True)
  tensors, targets = {}, set()
  for leaf_path, value in hf._flat_paths(adapters):
    array = np.asarray(jax.device_get(value))
    for name, index in peft_names_of(cfg, leaf_path):
      factor = array if index is None else array[index]
      tensors[name] = np.ascontiguousarray(factor.T)
      targets.add(name.split(".")[-3])
  if not tensors:
    raise ValueError("save_peft_adapter: the tree holds no LoRA factors")
  hf.write_safetensors(tensors, os.path.join(path, WEIGHTS_FILE))
  with open(os.path.join(path, CONFIG_FILE), "w") as f:
    json.dump(adapter_config(cfg, targets, base_model), f, indent=2)


def read_adapter_config(path: str) -> dict:
  """The adapter_config.json of a PEFT LoRA directory rljax can read; a ``ModelFileError`` naming
  the problem otherwise (not a PEFT directory, another PEFT method, an option rljax does not
  implement)."""
  file = os.path.join(path, CONFIG_FILE)
  if not os.path.isdir(path) or not os.path.isfile(file):
    raise ModelFileError(f"{path!r} is not a PEFT adapter directory (no {CONFIG_FILE})")
  try:
    with open(file) as f:
      config = json.load(f)
    if not isinstance(config, dict):
      raise ValueError("not a JSON object")
  except (OSError, ValueError) as e:
    raise ModelFileError(f"{file} is not readable JSON ({type(e).__name__}: {e})") from None
  if config.get("peft_type") != "LORA":
    raise ModelFileError(f"{path!r} holds a {config.get('peft_type')!r} PEFT adapter; rljax "
                         "reads LoRA adapters (peft_type 'LORA') only")
  if config.get("task_type") not in _TASKS:
    raise ModelFileError(f"{path!r} is a {config['task_type']} adapter; rljax reads adapters "
                         "of causal language models (task_type 'CAUSAL_LM')")
  for key, (allowed, what) in _OPTIONS.items():
    if key in config and config[key] not in allowed:
      raise ModelFileError(f"{file} sets {key}={json.dumps(config[key])} ({what}), which rljax "
                           f"LoRA does not implement; it reads {key}="
                           f"{' or '.join(json.dumps(a) for a in allowed)}")
  weights = os.path.join(path, WEIGHTS_FILE)
  if not os.path.isfile(weights):
    other = " (adapter_model.bin: re-save it with safe_serialization=True)" \
        if os.path.isfile(os.path.join(path, "adapter_model.bin")) else ""
    raise ModelFileError(f"{path!r} is not a PEFT adapter directory: no {WEIGHTS_FILE}{other}")
  return config


def _check_scale(path: str, config: dict, cfg: ModelConfig) -> None:
  """The adapter's rank and alpha are the run's (``model.lora.rank`` / ``alpha``)."""
  rank, alpha = config.get("r", 8), config.get("lora_alpha", 8)  # PEFT's defaults
  if rank != cfg.lora_rank:
    raise ModelFileError(f"the PEFT adapter {path!r} has rank r={rank} but model.lora.rank="
                         f"{cfg.lora_rank}: set model.lora.rank={rank}")
  if float(alpha) != float(cfg.lora_alpha):
    raise ModelFileError(f"the PEFT adapter {path!r} has lora_alpha={alpha} but model.lora.alpha="
                         f"{_number(cfg.lora_alpha)}: set model.lora.alpha={alpha}")


def _open(file: str):
  try:
    return safe_open(file, framework="numpy")
  except Exception as e:  # safetensors' own error types (SafetensorError, OSError, ...)
    raise ModelFileError(f"{file} is not a readable safetensors file ({type(e).__name__}: "
                         f"{e})") from None


def check_peft_adapter(path: str, cfg: ModelConfig) -> dict:
  """What ``load_peft_adapter`` would refuse, from adapter_config.json and the safetensors header
  alone (nothing is read): {PEFT tensor name: (adapter leaf path, expert index or None)}.

  Refuses in one line (``ModelFileError``): a directory that is no PEFT LoRA adapter, an option
  rljax does not implement, a rank or alpha other than the config's (naming the key to set),
  target modules other than the config's or that this model lacks, a tensor of another base's
  shape (naming the tensor and both shapes) and missing tensors.
  """
  config = read_adapter_config(path)
  _check_scale(path, config, cfg)
  file = os.path.join(path, WEIGHTS_FILE)
  base_tree = transformer.param_shapes(cfg.base)
  base = dict(hf._flat_paths(base_tree))
  names = hf.tensor_names(cfg)
  family = families.get(cfg.model_type)
  placed, experts, targets = {}, {}, set()
  with _open(file) as f:
    shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
  for name, shape in shapes.items():
    parsed = _parse_name(name)
    if parsed is None:
      raise ModelFileError(f"{file}: tensor {name!r} is no LoRA factor (lora_A / lora_B) of a "
                           "module's weight; rljax reads plain LoRA adapters")
    module_path, factor = parsed
    hf_name = family.rename(module_path)  # the module tree's name -> the checkpoint's
    module = module_name(hf_name)
    if module not in lora.TARGETS:
      raise ModelFileError(f"the PEFT adapter {path!r} adapts {module!r} ({name!r}); rljax LoRA "
                           f"adapts {', '.join(lora.TARGETS)}")
    mapped = names.get(hf_name)
    if mapped is None or mapped[0] not in base:
      raise ModelFileError(f"the PEFT adapter {path!r} adapts {hf_name!r}, which this "
                           f"{cfg.model_type} model ({cfg.num_layers} layers) does not have: "
                           "an adapter of another base model")
    kernel, _, index = mapped
    d_in, d_out = base[kernel].shape[-2:]
    want = (cfg.lora_rank, d_in) if factor == lora.A else (d_out, cfg.lora_rank)
    if shape != want:
      raise ModelFileError(f"the PEFT adapter {path!r}: tensor {name!r} has shape {shape}, this "
                           f"model expects {want}: an adapter of another base model")
    targets.add(module)
    leaf = adapter_path(kernel, factor)
    placed[name] = (leaf, index)
    if index is not None:
      experts.setdefault(leaf, set()).add(index)
  _check_targets(path, config, cfg, targets)
  want = dict(hf._flat_paths(lora.adapter_shapes(cfg, base_tree)))
  have = {leaf for leaf, index in placed.values() if index is None}
  have |= {leaf for leaf, got in experts.items() if len(got) == want[leaf][0]}
  missing = [p for p in want if p not in have]
  if missing:
    names = [n for n, i in peft_names_of(cfg, missing[0])
             if i is None or i not in experts.get(missing[0], ())]
    raise ModelFileError(f"the PEFT adapter {path!r} lacks {len(missing)} of the factors "
                         f"model.lora.targets={list(cfg.lora_targets)} attach to this model, "
                         f"e.g. {names[0]!r}")
  return placed


def load_peft_adapter(path: str, cfg: ModelConfig, place=None) -> dict:
  """The adapter tree (``rljax.models.lora`` layout) of the PEFT LoRA directory ``path`` for the
  model ``cfg``: each factor transposed, expert modules stacked, in ``cfg.param_dtype``.
  ``place(path, array)`` puts each leaf on devices (default ``jnp.asarray``). Whatever
  ``check_peft_adapter`` refuses is refused first, before any tensor is read."""
  placed = check_peft_adapter(path, cfg)
  place = place or (lambda _, x: jnp.asarray(x))
  dtype = np.dtype(jnp.dtype(cfg.param_dtype))
  shapes = dict(hf._flat_paths(lora.adapter_shapes(cfg, transformer.param_shapes(cfg.base))))
  leaves = {leaf: np.empty(shape, dtype) for leaf, shape in shapes.items()}
  with _open(os.path.join(path, WEIGHTS_FILE)) as f:
    for name, (leaf, index) in placed.items():
      value = np.asarray(f.get_tensor(name)).T.astype(dtype)
      if index is None:
        leaves[leaf] = value
      else:
        leaves[leaf][index] = value
  tree: dict = {}
  for leaf, value in leaves.items():
    hf._set(tree, leaf, place(leaf, value))
  return tree


def _check_targets(path: str, config: dict, cfg: ModelConfig, found: set) -> None:
  """The adapter's target modules (listed in its config, found among its tensors) are the ones
  ``model.lora.targets`` names and this model has."""
  listed = config.get("target_modules")
  listed = set(listed) if isinstance(listed, (list, tuple)) else set()  # a regex: its tensors
  unknown = sorted(listed - set(lora.TARGETS))
  if unknown:
    raise ModelFileError(f"the PEFT adapter {path!r} targets {unknown}, which rljax LoRA does not "
                         f"adapt (it adapts {', '.join(lora.TARGETS)})")
  targets = found | listed
  if targets != set(cfg.lora_targets):
    want = [t for t in lora.TARGETS if t in targets]
    raise ModelFileError(f"the PEFT adapter {path!r} targets {want} but model.lora.targets="
                         f"{list(cfg.lora_targets)}: set model.lora.targets={want}")

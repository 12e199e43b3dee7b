"""Hugging Face checkpoints: load a local directory (config.json + safetensors) and export back.

Loading streams tensor by tensor: each tensor is read in its stored dtype, transposed where the
layouts differ, cast to the parameter dtype and placed, so a bf16 checkpoint never exists twice in
float32 on the host.
"""
from __future__ import annotations

import json
import os
import re
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from rljax.errors import MissingTensorError, ModelFileError
from rljax.models import llama
from rljax.models.config import ModelConfig

_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF suffix within a layer -> (path inside 'layers_i', transpose)
_LAYER_PARAMS = {
    "input_layernorm.weight": (("input_layernorm", "scale"), False),
    "post_attention_layernorm.weight": (("post_attention_layernorm", "scale"), False),
    **{f"self_attn.{p}_proj.weight": (("self_attn", f"{p}_proj", "kernel"), True)
       for p in "qkvo"},
    **{f"self_attn.{p}_proj.bias": (("self_attn", f"{p}_proj", "bias"), False) for p in "qkvo"},
    **{f"mlp.{p}_proj.weight": (("mlp", f"{p}_proj", "kernel"), True)
       for p in ("gate", "up", "down")},
    **{f"mlp.{p}_proj.bias": (("mlp", f"{p}_proj", "bias"), False)
       for p in ("gate", "up", "down")},
}


def hf_name_to_path(name: str) -> tuple[tuple, bool] | None:
  """Map an HF tensor name to (rljax param path, transpose); None for known ignorable tensors."""
  if _IGNORED.match(name):
    return None
  if name == "model.embed_tokens.weight":
    return ("embed_tokens",), False
  if name == "model.norm.weight":
    return ("norm", "scale"), False
  if name == "lm_head.weight":
    return ("lm_head", "kernel"), True
  m = _LAYER.match(name)
  if m and m.group(2) in _LAYER_PARAMS:
    sub, transpose = _LAYER_PARAMS[m.group(2)]
    return (f"layers_{m.group(1)}",) + sub, transpose
  raise MissingTensorError(f"unexpected tensor {name!r} in the checkpoint (not part of a "
                           "Llama/Qwen2/Mistral causal LM)")


def path_to_hf_name(path: tuple) -> tuple[str, bool]:
  """Inverse of ``hf_name_to_path``."""
  if path == ("embed_tokens",):
    return "model.embed_tokens.weight", False
  if path == ("norm", "scale"):
    return "model.norm.weight", False
  if path == ("lm_head", "kernel"):
    return "lm_head.weight", True
  layer = int(path[0].split("_")[1])
  for suffix, (sub, transpose) in _LAYER_PARAMS.items():
    if sub == path[1:]:
      return f"model.layers.{layer}.{suffix}", transpose
  raise KeyError(f"parameter {'/'.join(map(str, path))} has no Hugging Face name")


def _safetensor_files(path: str) -> list[str]:
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      return [os.path.join(path, f) for f in sorted(set(weight_map.values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise ModelFileError(f"{index} is not a safetensors index ({type(e).__name__}: {e}); "
                           "re-download or re-export the model") from None
  single = os.path.join(path, "model.safetensors")
  if os.path.isfile(single):
    return [single]
  raise ModelFileError(f"no model.safetensors or model.safetensors.index.json in {path!r}")


def _unreadable(file: str, error: Exception) -> ModelFileError:
  return ModelFileError(f"{file} is not a readable safetensors file ({type(error).__name__}: "
                        f"{error}); it may be truncated: re-download or re-export it")


def _open_safetensors(file: str):
  from safetensors import safe_open
  if not os.path.isfile(file):
    raise ModelFileError(f"{file} is listed in the safetensors index but does not exist")
  try:
    return safe_open(file, framework="numpy")
  except Exception as e:  # safetensors' own error types (SafetensorError, OSError, ...)
    raise _unreadable(file, e) from None


def iter_hf_tensors(path: str) -> Iterator[tuple[str, np.ndarray]]:
  """(name, array in its stored dtype), one tensor at a time."""
  for file in _safetensor_files(path):
    with _open_safetensors(file) as f:
      for name in f.keys():
        try:
          tensor = f.get_tensor(name)
        except Exception as e:
          raise _unreadable(file, e) from None
        yield name, tensor


def iter_hf_shapes(path: str) -> Iterator[tuple[str, tuple]]:
  """(name, shape) of every tensor, from the files' headers only (nothing is read)."""
  for file in _safetensor_files(path):
    with _open_safetensors(file) as f:
      for name in f.keys():
        yield name, tuple(f.get_slice(name).get_shape())


def check_hf_dir(path: str, head: str = "lm") -> ModelConfig:
  """What ``load_hf`` would refuse, found from config.json and the safetensors headers in well
  under a second: an unsupported architecture, a truncated file, a tensor of the wrong shape, a
  missing one. Returns the architecture."""
  cfg = ModelConfig.from_hf_dir(path)
  _match_tensors(path, cfg, head, iter_hf_shapes(path))
  return cfg


def _flat_paths(tree, prefix=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _flat_paths(value, prefix + (key,))
    else:
      yield prefix + (key,), value


def _set(tree: dict, path: tuple, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def load_hf(path: str, *, dtype: str | None = None, param_dtype: str | None = None,
            head: str = "lm", place: Callable[[tuple, np.ndarray], jax.Array] | None = None,
            seed: int = 0) -> tuple[ModelConfig, dict]:
  """Load a local Hugging Face Llama/Qwen2/Mistral directory into rljax.

  ``head='value'`` builds a critic whose trunk is the checkpoint and whose scalar head is freshly
  initialised (value models start from the policy). ``place(path, array)`` puts each converted
  tensor on devices (e.g. with its ``NamedSharding``); the default is ``jnp.asarray``.
  Raises on a missing tensor, a shape mismatch or an unsupported architecture, naming it.
  """
  overrides = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v}
  cfg = ModelConfig.from_hf_dir(path, **overrides)
  shapes = dict(_flat_paths(llama.param_shapes(cfg, head)))
  place = place or (lambda _, x: jnp.asarray(x))
  params: dict = {}
  for name, tensor in iter_hf_tensors(path):
    mapped = _target(path, cfg, head, shapes, name, tuple(tensor.shape))
    if mapped is None:
      continue
    target, transpose = mapped
    value = tensor.T if transpose else tensor
    _set(params, target, place(target, np.asarray(value).astype(shapes[target].dtype)))
  loaded = set(p for p, _ in _flat_paths(params))
  if head == "value":
    pdt = np.dtype(shapes[("value_head", "kernel")].dtype)
    kernel = 0.02 * np.random.default_rng(seed).standard_normal((cfg.hidden_size, 1))
    fresh = {"kernel": kernel.astype(pdt), "bias": np.zeros((1,), pdt)}
    for key, value in fresh.items():
      _set(params, ("value_head", key), place(("value_head", key), np.asarray(value)))
      loaded.add(("value_head", key))
  _check_complete(path, shapes, loaded)
  return cfg, params


def _target(path: str, cfg: ModelConfig, head: str, shapes: dict, name: str, shape: tuple):
  """(param path, transpose) of the HF tensor ``name`` of ``shape``, None if it is ignored;
  a tensor with no place or of the wrong shape is a ``ModelFileError`` naming it."""
  mapped = hf_name_to_path(name)
  if mapped is None:
    return None
  target, transpose = mapped
  if target not in shapes:
    if target == ("lm_head", "kernel") and (cfg.tie_embeddings or head == "value"):
      return None  # a tied checkpoint may still store the (identical) output matrix
    raise MissingTensorError(f"{path}: tensor {name!r} has no place in a model with this "
                             "config.json")
  want = tuple(shapes[target].shape)
  want = want[::-1] if transpose else want
  if shape != want:
    raise ModelFileError(f"{path}: tensor {name!r} has shape {shape}, expected {want} by its "
                         "config.json")
  return target, transpose


def _match_tensors(path: str, cfg: ModelConfig, head: str, named_shapes) -> None:
  shapes = dict(_flat_paths(llama.param_shapes(cfg, head)))
  loaded = set()
  for name, shape in named_shapes:
    mapped = _target(path, cfg, head, shapes, name, shape)
    if mapped is not None:
      loaded.add(mapped[0])
  if head == "value":
    loaded |= {("value_head", "kernel"), ("value_head", "bias")}  # made fresh, never loaded
  _check_complete(path, shapes, loaded)


def _check_complete(path: str, shapes: dict, loaded: set) -> None:
  missing = [p for p in shapes if p not in loaded]
  if missing:
    names = []
    for p in missing:
      try:
        names.append(path_to_hf_name(p)[0])
      except KeyError:
        names.append("/".join(map(str, p)))
    raise MissingTensorError(f"checkpoint {path!r} is missing tensors: {names}")


def save_hf(path: str, cfg: ModelConfig, params: dict, *, dtype: str | None = None,
            max_shard_bytes: int = 2 << 30, tokenizer=None) -> None:
  """Write ``params`` as a directory ``transformers.AutoModelForCausalLM`` loads.

  Shards into several safetensors files with an index when larger than ``max_shard_bytes``.
  """
  import ml_dtypes
  from safetensors.numpy import save_file
  if "value_head" in params:
    raise ValueError("save_hf exports causal-LM policies; this tree holds a value model")
  os.makedirs(path, exist_ok=True)
  out_dtype = np.dtype(ml_dtypes.bfloat16) if (dtype or cfg.param_dtype) == "bfloat16" \
      else np.dtype(dtype or cfg.param_dtype)
  shards: list[dict] = [{}]
  size = 0
  for p, value in _flat_paths(params):
    name, transpose = path_to_hf_name(p)
    array = np.asarray(jax.device_get(value)).astype(out_dtype)
    array = np.ascontiguousarray(array.T if transpose else array)
    if size and size + array.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = array
    size += array.nbytes
  hf_cfg = cfg.to_hf_dict()
  hf_cfg["torch_dtype"] = str(np.dtype(out_dtype)) if out_dtype != ml_dtypes.bfloat16 \
      else "bfloat16"
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
      weight_map.update({name: file for name in shard})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
  if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
    tokenizer.save_pretrained(path)


def check_conversion(path: str, prompts: list[list[int]] | None = None, seed: int = 0) -> dict:
  """Compare rljax logits with ``transformers`` logits on a left-padded batch.

  Returns ``{'max_abs_diff', 'mean_kl', 'nonfinite_logits'}`` over valid positions (KL(hf ||
  rljax) per token; the count of NaN or infinite logits of either side).
  """
  try:
    import torch
    import transformers
  except ImportError as e:
    raise RuntimeError("check-conversion needs PyTorch and transformers: "
                       "pip install 'rljax[hf]' (torch==2.13.0)") from e
  cfg, params = load_hf(path, dtype="float32", param_dtype="float32")
  if prompts is None:
    rng = np.random.default_rng(seed)
    lengths = [7, 12, 4, 16]
    prompts = [list(rng.integers(0, cfg.vocab_size, n)) for n in lengths]
  width = max(len(p) for p in prompts)
  tokens = np.zeros((len(prompts), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, p in enumerate(prompts):
    tokens[i, width - len(p):] = p
    mask[i, width - len(p):] = 1
  ours = np.asarray(jax.jit(lambda p, t, m: llama.logits(cfg, p, t, m))(params, tokens, mask),
                    np.float64)
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  model.eval()
  with torch.no_grad():
    pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
    theirs = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                   attention_mask=torch.tensor(mask, dtype=torch.long),
                   position_ids=torch.tensor(pos, dtype=torch.long)).logits.double().numpy()
  valid = mask.astype(bool)
  nonfinite = int((~np.isfinite(ours[valid])).sum() + (~np.isfinite(theirs[valid])).sum())
  diff = np.abs(ours - theirs)[valid]
  lp_t = theirs - _logsumexp(theirs)
  lp_o = ours - _logsumexp(ours)
  kl = (np.exp(lp_t) * (lp_t - lp_o)).sum(-1)[valid]
  return {"max_abs_diff": float(diff.max()), "mean_kl": float(kl.mean()),
          "nonfinite_logits": nonfinite}


def _logsumexp(x):
  m = x.max(-1, keepdims=True)
  return m + np.log(np.exp(x - m).sum(-1, keepdims=True))

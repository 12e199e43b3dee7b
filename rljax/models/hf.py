"""Hugging Face checkpoints: load a local directory (config.json + safetensors) and export back.

Causal LMs (``*ForCausalLM``: ``head='lm'``) and reward models (``*ForSequenceClassification``
with one label: ``head='score'``, the ``score.weight`` [1, D] projection without bias over the
last real token) of every supported family.

Loading streams tensor by tensor: each tensor is read in its stored dtype, transposed where the
layouts differ, cast to the parameter dtype and placed, so a bf16 checkpoint never exists twice in
float32 on the host.
"""
from __future__ import annotations

import functools
import json
import os
import re
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rljax.errors import MissingTensorError, ModelFileError
from rljax.models import families, transformer
from rljax.models.config import ModelConfig, read_hf_config

_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
CAUSAL_LM, SEQUENCE_CLASSIFIER = "ForCausalLM", "ForSequenceClassification"
SCORE_TENSOR = "score.weight"


@functools.lru_cache(maxsize=32)
def tensor_names(cfg: ModelConfig) -> dict:
  """Every HF tensor name the family knows for ``cfg`` -> (rljax param path, transpose, expert
  index or None): the family's per-layer names (``Family.layer_tensors``) and the global ones."""
  family = families.get(cfg.model_type)
  names = {"model.embed_tokens.weight": (("embed_tokens",), False, None),
           "model.norm.weight": (("norm", "scale"), False, None),
           "lm_head.weight": (("lm_head", "kernel"), True, None),
           SCORE_TENSOR: (("score", "kernel"), True, None)}
  for layer in range(cfg.num_layers):
    for suffix, (sub, transpose, index) in family.layer_tensors(cfg, layer).items():
      names[f"model.layers.{layer}.{suffix}"] = ((f"layers_{layer}",) + sub, transpose, index)
  names.update(family.extra_tensors(cfg))
  return names


def hf_name_to_path(cfg: ModelConfig, name: str) -> tuple[tuple, bool, int | None] | None:
  """Map an HF tensor name to (rljax param path, transpose, expert index); None for known
  ignorable tensors."""
  family = families.get(cfg.model_type)
  if _IGNORED.match(name) or family.ignored(name):
    return None
  mapped = tensor_names(cfg).get(family.rename(name))
  if mapped is None:
    raise MissingTensorError(f"unexpected tensor {name!r} in the checkpoint (not part of a "
                             f"{cfg.model_type} causal LM)")
  return mapped


def hf_names_of(cfg: ModelConfig, path: tuple) -> list[tuple[str, bool, int | None]]:
  """Inverse of ``hf_name_to_path``: the HF tensors of one parameter (one per expert for stacked
  expert weights)."""
  out = [(name, t, i) for name, (p, t, i) in tensor_names(cfg).items() if p == path]
  if not out:
    raise KeyError(f"parameter {'/'.join(map(str, path))} has no Hugging Face name")
  return sorted(out, key=lambda x: -1 if x[2] is None else x[2])


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


def num_labels(hf: dict) -> int:
  """Outputs of a ``*ForSequenceClassification`` config.json: its ``id2label`` entries
  (``transformers`` saves those, not ``num_labels``), else ``num_labels``, else its default 2."""
  if isinstance(hf.get("id2label"), dict):
    return len(hf["id2label"])
  return int(hf.get("num_labels", 2))


def check_sequence_classifier(path: str) -> dict:
  """The config.json of ``path`` when it is a reward model rljax can score with: a
  ``*ForSequenceClassification`` architecture with one label. Anything else is one
  ``ModelFileError`` naming what it is instead."""
  hf = read_hf_config(path)
  archs = hf.get("architectures") or []
  if not any(str(a).endswith(SEQUENCE_CLASSIFIER) for a in archs):
    raise ModelFileError(f"{path} is not a sequence classifier (config.json architectures="
                         f"{archs}): a reward model is a *{SEQUENCE_CLASSIFIER} checkpoint with "
                         "one label (score head)")
  labels = num_labels(hf)
  if labels != 1:
    raise ModelFileError(f"{path} is a sequence classifier with {labels} labels; a reward model "
                         "has one (a scalar score): num_labels=1")
  return hf


def check_hf_dir(path: str, head: str = "lm") -> ModelConfig:
  """What ``load_hf`` would refuse, found from config.json and the safetensors headers in well
  under a second: an unsupported architecture (for ``head='score'``, anything but a sequence
  classifier with one label), a truncated file, a tensor of the wrong shape, a missing one.
  Returns the architecture."""
  if head == "score":
    check_sequence_classifier(path)
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
  """Load a local Hugging Face directory of a supported family into rljax.

  ``head='value'`` builds a critic whose trunk is the checkpoint and whose scalar head is freshly
  initialised (value models start from the policy). ``head='score'`` loads a reward model: a
  ``*ForSequenceClassification`` checkpoint with one label (``check_sequence_classifier``). ``place(path, array)`` puts each converted
  tensor on devices (e.g. with its ``NamedSharding``); the default is ``jnp.asarray``.
  Raises on a missing tensor, a shape mismatch or an unsupported architecture, naming it.
  """
  overrides = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v}
  if head == "score":
    check_sequence_classifier(path)
  cfg = ModelConfig.from_hf_dir(path, **overrides)
  shapes = dict(_flat_paths(transformer.param_shapes(cfg, head)))
  place = place or (lambda _, x: jnp.asarray(x))
  params: dict = {}
  stacks: dict = {}  # expert weights: one buffer per parameter, filled one expert at a time
  for name, tensor in iter_hf_tensors(path):
    mapped = _target(path, cfg, head, shapes, name, tuple(tensor.shape))
    if mapped is None:
      continue
    target, transpose, index = mapped
    value = np.asarray(tensor.T if transpose else tensor).astype(shapes[target].dtype)
    if index is None:
      _set(params, target, place(target, value))
      continue
    if target not in stacks:
      stacks[target] = (np.empty(shapes[target].shape, shapes[target].dtype), set())
    stacks[target][0][index] = value
    stacks[target][1].add(index)
  for target, (value, filled) in stacks.items():
    if len(filled) == value.shape[0]:
      _set(params, target, place(target, value))
  loaded = set(p for p, _ in _flat_paths(params))
  if head == "value":
    pdt = np.dtype(shapes[("value_head", "kernel")].dtype)
    kernel = 0.02 * np.random.default_rng(seed).standard_normal((cfg.hidden_size, 1))
    fresh = {"kernel": kernel.astype(pdt), "bias": np.zeros((1,), pdt)}
    for key, value in fresh.items():
      _set(params, ("value_head", key), place(("value_head", key), np.asarray(value)))
      loaded.add(("value_head", key))
  _check_complete(path, cfg, shapes, loaded)
  return cfg, params


def _target(path: str, cfg: ModelConfig, head: str, shapes: dict, name: str, shape: tuple):
  """(param path, transpose, expert index) of the HF tensor ``name`` of ``shape``, None if it is
  ignored; a tensor with no place or of the wrong shape is a ``ModelFileError`` naming it."""
  mapped = hf_name_to_path(cfg, name)
  if mapped is None:
    return None
  target, transpose, index = mapped
  if target not in shapes:
    if target == ("lm_head", "kernel") and (cfg.tie_embeddings or head != "lm"):
      return None  # a tied checkpoint may still store the (identical) output matrix
    if target == ("score", "kernel"):
      raise ModelFileError(f"{path} is a sequence classifier ({SCORE_TENSOR}): a reward model, "
                           "not a causal LM; name it where a reward model is read "
                           "(reward.model.source)")
    raise MissingTensorError(f"{path}: tensor {name!r} has no place in a model with this "
                             "config.json")
  want = tuple(shapes[target].shape)[0 if index is None else 1:]
  want = want[::-1] if transpose else want
  if shape != want:
    raise ModelFileError(f"{path}: tensor {name!r} has shape {shape}, expected {want} by its "
                         "config.json")
  return mapped


def _match_tensors(path: str, cfg: ModelConfig, head: str, named_shapes) -> None:
  shapes = dict(_flat_paths(transformer.param_shapes(cfg, head)))
  loaded, experts = set(), {}
  for name, shape in named_shapes:
    mapped = _target(path, cfg, head, shapes, name, shape)
    if mapped is None:
      continue
    if mapped[2] is None:
      loaded.add(mapped[0])
    else:
      experts.setdefault(mapped[0], set()).add(mapped[2])
  loaded |= {p for p, got in experts.items() if len(got) == shapes[p].shape[0]}
  if head == "value":
    loaded |= {("value_head", "kernel"), ("value_head", "bias")}  # made fresh, never loaded
  _check_complete(path, cfg, shapes, loaded)


def _check_complete(path: str, cfg: ModelConfig, shapes: dict, loaded: set) -> None:
  missing = [p for p in shapes if p not in loaded]
  if missing:
    names = []
    for p in missing:
      try:
        names.extend(name for name, _, _ in hf_names_of(cfg, p))
      except KeyError:
        names.append("/".join(map(str, p)))
    raise MissingTensorError(f"checkpoint {path!r} is missing tensors: {names}")


def write_safetensors(tensors: dict, path: str) -> None:
  """``tensors`` (name -> array) as the safetensors file ``path``, readable as the other files
  written beside it: mode ``0o666`` less the process's umask (``safetensors`` creates its files
  0600, so an account that serves the model could read config.json but not the weights)."""
  save_file(tensors, path, metadata={"format": "pt"})
  os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
  """The process's umask, read without changing it (``os.umask`` sets it, which would race with
  files that other threads create); from ``/proc`` where Linux has it."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except OSError:
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def save_hf(path: str, cfg: ModelConfig, params: dict, *, dtype: str | None = None,
            max_shard_bytes: int = 2 << 30, tokenizer=None) -> None:
  """Write ``params`` as a directory ``transformers.AutoModelForCausalLM`` loads, or, for a
  reward model (``head='score'`` params), ``AutoModelForSequenceClassification``: architecture
  ``<Family>ForSequenceClassification``, one label, ``pad_token_id`` (by which ``transformers``
  finds each row's last token).

  Shards into several safetensors files with an index when larger than ``max_shard_bytes``.
  """
  if "value_head" in params:
    raise ValueError("save_hf exports causal-LM policies and reward models; this tree holds a "
                     "value model")
  reward_model = "score" in params
  if reward_model and cfg.pad_token_id is None:
    raise ValueError("a reward model's export needs pad_token_id (transformers pools each row at "
                     "its last token that is not padding): set it in the ModelConfig")
  os.makedirs(path, exist_ok=True)
  out_dtype = np.dtype(ml_dtypes.bfloat16) if (dtype or cfg.param_dtype) == "bfloat16" \
      else np.dtype(dtype or cfg.param_dtype)
  shards: list[dict] = [{}]
  size = 0
  export_name = families.get(cfg.model_type).export_name
  for p, value in _flat_paths(params):
    full = np.asarray(jax.device_get(value)).astype(out_dtype)
    for name, transpose, index in hf_names_of(cfg, p):
      array = full if index is None else full[index]
      array = np.ascontiguousarray(array.T if transpose else array)
      if size and size + array.nbytes > max_shard_bytes:
        shards.append({})
        size = 0
      shards[-1][export_name(name)] = array
      size += array.nbytes
  hf_cfg = cfg.to_hf_dict()
  if reward_model:
    hf_cfg.update(architectures=[families.classifier_architecture(cfg.model_type, a)
                                 for a in hf_cfg["architectures"]],
                  id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
  hf_cfg["torch_dtype"] = str(np.dtype(out_dtype)) if out_dtype != ml_dtypes.bfloat16 \
      else "bfloat16"
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
  if len(shards) == 1:
    write_safetensors(shards[0], os.path.join(path, "model.safetensors"))
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      write_safetensors(shard, os.path.join(path, file))
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
    import torch  # the optional [hf] extra, for this check only
    import transformers  # slow to import: only for this check
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
  ours = np.asarray(jax.jit(lambda p, t, m: transformer.logits(cfg, p, t, m))(params, tokens, mask),
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

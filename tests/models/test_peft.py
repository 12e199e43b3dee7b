"""PEFT LoRA adapters (``rljax.models.peft``) against ``peft`` + ``transformers`` (float32): an
adapter written by peft gives peft's logits in rljax, rljax's export gives rljax's logits in
peft, and every adapter rljax cannot use is refused in one line."""
import json
import os
import shutil

import jax
import numpy as np
import peft  # installed by the test bootstrap (rljax[peft])
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from rljax.errors import ModelFileError
from rljax.models import hf, lora, transformer
from rljax.models import peft as rpeft
from tests import hf_models

RANK, ALPHA = 4, 8.0  # scale alpha / r = 2: a scale of 1 would hide a missing factor
TOL = 1e-4


def _logits_torch(model, tokens, mask):
  pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(pos, dtype=torch.long))
  return out.logits.double().numpy()


def _lora_cfg(base_cfg, **overrides):
  settings = dict(lora_rank=RANK, lora_alpha=ALPHA, lora_targets=lora.TARGETS)
  settings.update(overrides)
  return base_cfg.replace(**settings)


_logits = jax.jit(transformer.logits, static_argnums=0)  # one compile beats op-by-op dispatch


def _adapted_logits(cfg, base, adapters, tokens, mask):
  """rljax's forward with the adapters in place (``x W + (alpha/r) x A B``)."""
  params = lora.join_adapters(base, adapters)
  return np.asarray(_logits(cfg, params, tokens, mask), np.float64)


def _max_diff(a, b, mask):
  return float(np.abs(a - b)[mask.astype(bool)].max())


@pytest.fixture(scope="module")
def batch():
  return hf_models.left_padded([9, 5, 2], width=9, vocab=hf_models.VOCAB, seed=3)


@pytest.fixture(scope="module")
def qwen3(hf_dirs):
  """(HF dir, LoRA config, base params) of the tiny Qwen3 (q/k norms, GQA, tied head)."""
  base_cfg, base = hf.load_hf(hf_dirs["qwen3"], dtype="float32", param_dtype="float32")
  return hf_dirs["qwen3"], _lora_cfg(base_cfg), base


@pytest.fixture(scope="module")
def peft_written(qwen3, batch, tmp_path_factory):
  """An adapter trained-looking by peft (random non-zero lora_B on every projection) saved by
  ``save_pretrained``, and peft's logits of the adapted model."""
  path, _, _ = qwen3
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  config = peft.LoraConfig(r=RANK, lora_alpha=int(ALPHA), target_modules=list(lora.TARGETS),
                           task_type="CAUSAL_LM")
  model = peft.get_peft_model(model, config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "lora_B" in name:
        p.normal_(0.0, 0.05)
  model.eval()
  out = str(tmp_path_factory.mktemp("peft") / "adapter")
  model.save_pretrained(out)
  return out, _logits_torch(model, *batch)


def test_peft_written_adapter_gives_peft_logits(qwen3, peft_written, batch):
  _, cfg, base = qwen3
  path, theirs = peft_written
  adapters = rpeft.load_peft_adapter(path, cfg)
  ours = _adapted_logits(cfg, base, adapters, *batch)
  assert _max_diff(ours, theirs, batch[1]) <= TOL
  # the adapters matter: the base alone is far from the adapted logits
  base_only = np.asarray(_logits(cfg.base, base, *batch), np.float64)
  assert _max_diff(base_only, theirs, batch[1]) > 100 * TOL


def _random_adapters(cfg, base, seed):
  """Non-zero A and B (B = 0 would leave nothing to check), in the layout rljax trains."""
  rng = np.random.default_rng(seed)
  shapes = lora.adapter_shapes(cfg, base)
  return jax.tree.map(lambda s: (0.1 * rng.standard_normal(s)).astype(np.float32), shapes,
                      is_leaf=lambda x: isinstance(x, tuple))


@pytest.fixture(scope="module")
def qwen3_moe_sparse(tmp_path_factory):
  """A tiny Qwen3-MoE whose every layer is sparse (as the released Qwen3-MoE models; with a
  dense layer among sparse ones peft>=0.18 on transformers 5 drops that layer's MLP adapters
  when it fuses the per-expert modules)."""
  path = str(tmp_path_factory.mktemp("hf") / "qwen3_moe_sparse")
  hf_models.build("qwen3_moe", path, mlp_only_layers=[])
  base_cfg, base = hf.load_hf(path, dtype="float32", param_dtype="float32")
  return path, _lora_cfg(base_cfg), base


@pytest.mark.parametrize("model", ["qwen3", "qwen3_moe_sparse"])
def test_rljax_adapter_loads_in_peft_with_rljax_logits(model, batch, tmp_path, request):
  path, cfg, base = request.getfixturevalue(model)
  adapters = _random_adapters(cfg, base, seed=1)
  out = str(tmp_path / "adapter")
  rpeft.save_peft_adapter(out, cfg, adapters, base_model=path)
  with open(os.path.join(out, rpeft.CONFIG_FILE)) as f:
    written = json.load(f)
  assert (written["r"], written["lora_alpha"], written["base_model_name_or_path"]) == \
      (RANK, ALPHA, path)
  ours = _adapted_logits(cfg, base, adapters, *batch)
  theirs = peft.PeftModel.from_pretrained(
      transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), out)
  theirs.eval()
  assert _max_diff(ours, _logits_torch(theirs, *batch), batch[1]) <= TOL
  # and rljax reads its own export back, factor for factor
  again = rpeft.load_peft_adapter(out, cfg)
  for (p, a), (_, b) in zip(hf._flat_paths(adapters), hf._flat_paths(again)):
    np.testing.assert_array_equal(np.asarray(b), a, err_msg="/".join(p))


def _variant(src, dst, config=None, tensors=None):
  """A copy of the adapter ``src`` with ``config`` keys replaced and ``tensors(dict)`` applied."""
  shutil.copytree(src, dst)
  if config:
    with open(os.path.join(dst, rpeft.CONFIG_FILE)) as f:
      data = json.load(f)
    data.update(config)
    with open(os.path.join(dst, rpeft.CONFIG_FILE), "w") as f:
      json.dump(data, f)
  if tensors:
    file = os.path.join(dst, rpeft.WEIGHTS_FILE)
    save_file(tensors(load_file(file)), file, metadata={"format": "pt"})
  return str(dst)


def _bad_adapter(case, src, dst, hf_dirs):
  """The directory of ``case``: a copy of the peft-written adapter ``src`` with one thing
  changed (or ``src`` itself where the model's config is what differs)."""
  if case == "not_peft":
    return hf_dirs["qwen3"]  # a model, not an adapter
  if case == "no_weights":
    os.remove(os.path.join(_variant(src, dst), rpeft.WEIGHTS_FILE))
    return dst
  options = {"ia3": {"peft_type": "IA3"}, "rslora": {"use_rslora": True},
             "dora": {"use_dora": True}, "pissa": {"init_lora_weights": "pissa"}}
  if case in options:
    return _variant(src, dst, options[case])
  if case == "lm_head":
    return _variant(src, dst, tensors=_lm_head_factors)
  if case == "missing_factor":
    return _variant(src, dst, tensors=lambda t: {k: v for k, v in t.items()
                                                 if ".1.mlp.down_proj.lora_B" not in k})
  if case == "fused_experts":  # what peft writes for a transformers-5 Qwen3-MoE
    return _variant(src, dst, {"target_parameters": ["down_proj", "gate_up_proj"],
                               "rank_pattern": {r".*\.gate_up_proj": 2 * RANK}})
  return src


def _lm_head_factors(t):
  return dict(t, **{"base_model.model.lm_head.lora_A.weight": np.zeros((RANK, 64), np.float32),
                    "base_model.model.lm_head.lora_B.weight": np.zeros((97, RANK), np.float32)})


# case -> what the one line says
REFUSALS = {
    "not_peft": "is not a PEFT adapter directory (no adapter_config.json)",
    "no_weights": "is not a PEFT adapter directory: no adapter_model.safetensors",
    "ia3": "holds a 'IA3' PEFT adapter; rljax reads LoRA adapters",
    "rslora": "sets use_rslora=true (rank-stabilised scaling alpha/sqrt(r)), which rljax LoRA "
              "does not implement",
    "dora": "sets use_dora=true (DoRA's magnitude vectors)",
    "pissa": 'sets init_lora_weights="pissa" (an init that rewrites the base weights)',
    "lm_head": "adapts 'lm_head'",
    "missing_factor": "lacks 1 of the factors model.lora.targets=['q_proj', 'k_proj', 'v_proj', "
                      "'o_proj', 'gate_proj', 'up_proj', 'down_proj'] attach to this model, e.g. "
                      "'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight'",
    "fused_experts": 'sets target_parameters=["down_proj", "gate_up_proj"] (LoRA on fused expert '
                     "parameters, rank 2r on gate_up_proj)",
    "other_base": "tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight' has "
                  "shape (32, 4), this model expects (64, 4): an adapter of another base model",
    "rank": "has rank r=4 but model.lora.rank=8: set model.lora.rank=4",
    "alpha": "has lora_alpha=8 but model.lora.alpha=16: set model.lora.alpha=8",
    "targets": "targets ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', "
               "'down_proj'] but model.lora.targets=['q_proj', 'v_proj']: set "
               "model.lora.targets=['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', "
               "'up_proj', 'down_proj']",
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_adapters_are_refused_in_one_line(case, qwen3, peft_written, hf_dirs, tmp_path):
  _, cfg, _ = qwen3
  src, _ = peft_written
  path = _bad_adapter(case, src, str(tmp_path / "adapter"), hf_dirs)
  if case == "other_base":  # the Qwen3 adapter onto the tiny Llama (4 KV heads, not 2)
    llama_cfg, _ = hf.load_hf(hf_dirs["llama"], dtype="float32", param_dtype="float32")
    cfg = _lora_cfg(llama_cfg)
  cfg = {"rank": lambda: cfg.replace(lora_rank=8), "alpha": lambda: cfg.replace(lora_alpha=16.0),
         "targets": lambda: cfg.replace(lora_targets=("q_proj", "v_proj"))}.get(case, lambda: cfg)()
  with pytest.raises(ModelFileError) as info:
    rpeft.load_peft_adapter(path, cfg)
  message = str(info.value)
  assert "\n" not in message
  assert REFUSALS[case] in message, message

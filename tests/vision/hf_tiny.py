"""What the vision families' parity tests share: a tiny transformers model saved with its biases
and norms away from their init, the Qwen image processor's three test images, and the export
round trip's tensor-by-tensor check."""
import numpy as np
import torch
import transformers

from rljax.models import ModelConfig, hf


def save_tiny(model, path: str, also=lambda name: False, init=lambda name, p: None):
  """Saves ``model`` (float32, eval) after moving every bias, norm (and ``also(name)``) weight by
  0.1 N(0, 1) and calling ``init`` on each parameter (e.g. one transformers zeroes); returns
  (path, model, rljax cfg, params) as ``hf.load_hf`` reads the directory back."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name or also(name):
        p.add_(0.1 * torch.randn_like(p))
      init(name, p)
  model.save_pretrained(path)
  cfg, params = hf.load_hf(path)
  return path, model, cfg, params


def qwen_images():
  """Three images of different sizes (grids 4x4, 6x4, 4x10 patches of 4 pixels) through the HF
  Qwen2-VL image processor: (pixels [N, 96], grid [3, 3])."""
  proc = transformers.Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                               min_pixels=64, max_pixels=64 * 64)
  rng = np.random.default_rng(0)
  pics = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((16, 16), (24, 16),
                                                                       (16, 40))]
  out = proc(images=pics, return_tensors="np")
  return out["pixel_values"].astype(np.float32), out["image_grid_thw"].astype(np.int64)


def assert_export_round_trip(path: str, cfg, params, out: str):
  """load -> save: every tensor of the checkpoint bit-identical under its names, and the config
  read back equal."""
  hf.save_hf(out, cfg, params)
  original = dict(hf.iter_hf_tensors(path))
  exported = dict(hf.iter_hf_tensors(out))
  assert sorted(exported) == sorted(original)
  for name, value in original.items():
    assert exported[name].dtype == value.dtype and np.array_equal(exported[name], value), name
  assert ModelConfig.from_hf_dir(out) == cfg

"""The vision tower's cost in the scoring forward: the same rows with and without their images.

  python benchmarks/vision_scoring.py [--rows 16] [--image 112] [--new 32] [--reps 30]

A fresh tiny ``qwen2_5_vl`` policy (``model.source='tiny'`` at the test presets' sizes: a 1-layer
text model of width 32, a 2-block tower of width 32) scores ``--rows`` rows of one
``--image`` x ``--image`` image (14-pixel patches: ``(image/14)^2`` patches, a quarter as many
image tokens) amid text, followed by ``--new`` completion tokens: ``learner.step.policy_stats``,
jitted, once with the rows' images (the tower runs over each row's patches) and once as text
(the same token rows, placeholders embedded as tokens). Prints the median milliseconds of each
over ``--reps`` calls after a warm-up, alternating, and their ratio; on a loaded machine only the
ratio means anything.
"""
import argparse
import os
import statistics
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_common import timed  # noqa: E402
from rljax import models  # noqa: E402
from rljax.config import loader  # noqa: E402
from rljax.learner import step  # noqa: E402
from rljax.rollout.record import Rollout  # noqa: E402
from rljax.vision import multimodal, qwen2_5_vl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {"model.hidden_size": "32", "model.intermediate_size": "64", "model.num_layers": "1",
         "model.num_heads": "2", "model.num_kv_heads": "1", "model.family": "qwen2_5_vl"}
VOCAB = 60  # data.tokenizer='char_vl': the placeholders are ids 57-59


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--image", type=int, default=112, help="side in pixels (multiple of 28)")
  parser.add_argument("--new", type=int, default=32, help="completion tokens per row")
  parser.add_argument("--reps", type=int, default=30)
  args = parser.parse_args(argv)
  config = loader.load_config(os.path.join(ROOT, "configs", "base.py"), list(SIZES.items()))
  cfg = models.tiny_config(config.model, VOCAB)
  params = models.init_params(cfg, 0)
  vision = qwen2_5_vl.vision_config(cfg)
  side = args.image // vision["patch_size"]
  n_image = side * side // 4
  rng = np.random.default_rng(0)
  row = ([5, 6, vision["vision_start_token_id"]] + [vision["image_token_id"]] * n_image
         + [vision["vision_end_token_id"]] + list(rng.integers(3, 50, 12)))
  b, t = args.rows, args.new
  tokens = np.tile(np.array(row, np.int32), (b, 1))
  mask = np.ones_like(tokens)
  patch = 3 * vision["temporal_patch_size"] * vision["patch_size"] ** 2
  pixels = rng.standard_normal((b * side * side, patch)).astype(np.float32)
  images = multimodal.row_images(cfg, tokens, mask, pixels, np.tile([[1, side, side]], (b, 1)))
  zeros = np.zeros((b, t), np.float32)
  text = Rollout(prompt_tokens=tokens, prompt_mask=mask,
                 tokens=rng.integers(3, 50, (b, t)).astype(np.int32),
                 mask=np.ones((b, t), np.int32), sampler_logp=zeros, draw_logp=zeros,
                 lengths=np.full(b, t, np.int32), truncated=np.zeros(b, bool))
  with_images = text.replace(extras={"images": images})
  score = jax.jit(lambda p, r: step.policy_stats(cfg, p, r, 16)[0])
  run = lambda r: lambda: score(params, r).block_until_ready()
  for r in (text, with_images):
    run(r)()  # compile
  ms = {"text": [], "images": []}
  for _ in range(args.reps):
    ms["text"] += [1e3 * s for s in timed(run(text), 1)[1]]
    ms["images"] += [1e3 * s for s in timed(run(with_images), 1)[1]]
  med = {k: statistics.median(v) for k, v in ms.items()}
  print(f"| rows | image | image tokens | prompt + new | text ms | with images ms | ratio |")
  print(f"|---|---|---|---|---|---|---|")
  print(f"| {b} | {args.image}x{args.image} | {n_image} | {len(row)} + {t} | {med['text']:.2f} | "
        f"{med['images']:.2f} | {med['images'] / med['text']:.2f} |")


if __name__ == "__main__":
  main()

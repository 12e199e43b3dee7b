"""RL on images: sums drawn as 28 x 84 pictures, read and answered by a tiny Qwen2.5-VL policy.

  python -m rljax train --config configs/tasks/visual.py

``embedded:visual_arithmetic`` draws each problem ('17+5') in a bitmap font with jitter, random
colours and noise; the prompt is the image and '='; the reference solution transcribes, then
computes ('17+5=22 #22'). The policy is a fresh Qwen2.5-VL (a 2-block vision tower and M-RoPE
over the ``char_vl`` vocabulary): the SFT cold start (``sft``) learns from reference solutions to
read the images, then GRPO trains on held-in images and the held-out accuracy is measured on
expressions never shown in training (docs/vision.md, docs/vision_data.md).

Measured (docs/results/visual/): the cold start does not read the digits yet. Its loss stops at
0.51 nats a token, the floor of a policy that ignores the image, with exact match about 0.016;
7-pixel patches (``model.vision.patch_size=7``: 12 image tokens), a wider or deeper tower
(``model.vision.*``) and other SFT learning rates did not change that in up to 2000 steps, so
GRPO has no signal here. ``experiments/visual_seeds.py`` is the five-seed study for when it does.
``--config.train.steps=2`` for a smoke run; ``--config.model.family=qwen3_vl`` or ``=gemma3`` runs
the same task with a tiny Qwen3-VL or Gemma 3 policy (each family's image format, docs/vision.md;
Gemma 3's prompt is 9 tokens, blank lines around its image token, padded to 16).
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "sft"
  c.model.family = "qwen2_5_vl"
  c.data.source = "embedded:visual_arithmetic"
  c.data.tokenizer = "char_vl"  # the characters and Qwen2-VL's image placeholder tokens
  c.data.difficulty = 0  # '19+19' at most
  c.data.prompt_bucket = 8  # '<image>=': BOS, vision start, 3 image tokens, vision end, '='
  c.data.num_eval = 128
  c.rollout.max_new_tokens = 16  # the longest reference solution, '99+99=198 #198', is 14
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"  # no reference model: one forward less per step
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 2
  c.train.steps = 100
  c.train.eval_every = 50
  c.train.run_dir = "runs/visual"
  c.sft.out_dir = "runs/sft_visual"
  c.sft.stop_match = 0.9
  c.sft.check_every = 50
  c.sft.check_size = 128
  return c

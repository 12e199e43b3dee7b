"""RL on images: sums drawn as 28 x 84 pictures, read and answered by a tiny Qwen2.5-VL policy.

  python -m rljax train --config configs/tasks/visual.py

``embedded:visual_arithmetic`` draws each problem ('17+5') in a bitmap font with jitter and
noise; the prompt is the image and '='; the reference solution transcribes, then computes
('17+5=22 #22'). The policy is a fresh Qwen2.5-VL (a 2-block vision tower over 7-pixel patches,
12 image tokens, and M-RoPE over the ``char_vl`` vocabulary): the SFT cold start (``sft``) learns
from reference solutions to read the images, then GRPO trains on held-in images and the held-out
accuracy is measured on expressions never shown in training (docs/vision.md,
docs/vision_data.md).

Level 0 (black on white at a fixed place) is the one whose cold start learns to read on a CPU;
at level 1 and up (random colours of either polarity at a random offset) it did not. GRPO's gain
over the cold start, five seeds fixed in advance (``experiments/visual_confirm2.py``): the
current figure and the studies before it are in docs/results/visual/.
``--config.train.steps=2`` for a smoke run; ``--config.model.family=qwen3_vl`` or ``=gemma3`` runs
the same task with a tiny Qwen3-VL or Gemma 3 policy (each family's image format, docs/vision.md;
Gemma 3's prompt is 9 tokens, blank lines around its image token, padded to 16); their towers are
fixed, so the ``model.vision.*`` sizes go back to their defaults with it
(``--config.model.vision.patch_size=14 --config.model.vision.hidden_size=32
--config.model.vision.intermediate_size=64``), else the config check names them as unused.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "sft"
  c.model.family = "qwen2_5_vl"
  c.data.source = "embedded:visual_arithmetic"
  c.data.tokenizer = "char_vl"  # the characters and Qwen2-VL's image placeholder tokens
  c.data.difficulty = 0  # '19+19' at most, black on white at a fixed place (noise std 8)
  c.data.prompt_bucket = 16  # '<image>=': BOS, vision start, 12 image tokens, vision end, '='
  # 7-pixel patches (12 image tokens of 2x2 patches) and a 64-wide tower, as in the probe that
  # read (docs/results/visual/); the default 14-pixel ones (3 tokens) were tried on level 1 only.
  c.model.vision.patch_size = 7
  c.model.vision.hidden_size = 64
  c.model.vision.intermediate_size = 128
  # 512 held-out images: each of the 35 held-out sums drawn ~15 times, so that one image moves
  # the accuracy by 0.2 points, not 0.8.
  c.data.num_eval = 512
  c.rollout.max_new_tokens = 16  # the longest reference solution, '99+99=198 #198', is 14
  # 32 prompts a step: from a cold start that is right ~88% of the time most groups of 8 agree,
  # and 8 prompts a step left few groups with a reward spread (the pilot, docs/results/visual/).
  c.rollout.prompts_per_step = 32
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"  # no reference model: one forward less per step
  c.optim.lr = 3e-5  # from the level-0 cold start, one seed at 1e-4 lost held-out accuracy
  c.optim.warmup_steps = 2
  c.train.steps = 100
  c.train.eval_every = 50
  c.train.run_dir = "runs/visual"
  c.sft.out_dir = "runs/sft_visual"
  # At 1e-3 the cold start starts reading at about step 400; at the default 3e-3 it had not by
  # step 300 (its schedule's end), not run longer.
  c.sft.lr = 1e-3
  c.sft.warmup_steps = 20
  c.sft.steps = 1200
  c.sft.stop_match = 0.9
  c.sft.check_every = 100
  c.sft.check_size = 128
  return c

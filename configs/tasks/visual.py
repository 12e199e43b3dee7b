"""GRPO on the embedded visual task: read ``23+45`` from an image the package draws, answer 68.

  python -m rljax train --config configs/tasks/visual.py

Refused at start-up for now, in one line: the data side is here (the task
``embedded:visual_arithmetic``, the ``char_vl`` tokenizer that places its images, the patches
and grid sizes of Hugging Face's Qwen2-VL processor: docs/vision_data.md), but rljax's rollout
engines and learner take text prompts only so far (no policy samples or trains on images yet:
issue #59). The problems: a 28 x 84 pixel image of ``a+b`` (level 0: a, b <= 19; level 1: a +/- b
up to 99; level 2: also times), the prompt ``<image>=``, the reference solution ``19+7=26 #26``.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.model.source = "sft"
  c.data.source = "embedded:visual_arithmetic"
  c.data.tokenizer = "char_vl"  # the characters and Qwen2-VL's image placeholder tokens
  c.data.difficulty = 0  # '19+19' at most
  c.data.prompt_bucket = 8  # '<image>=': BOS, start, 3 image tokens, end, '='
  c.data.num_eval = 128
  c.rollout.max_new_tokens = 16  # the longest reference solution, '99+99=198 #198', is 14
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.algo.kl_placement = "none"  # no reference model: one forward less per step
  c.train.run_dir = "runs/visual"
  c.sft.out_dir = "runs/sft_visual"
  return c

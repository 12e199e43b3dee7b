"""An embedded visual task: arithmetic read from an image the package draws, no download.

``data.source='embedded:visual_arithmetic'``: the prompt is ``'<image>='`` and its one image shows
an expression such as ``23+45`` in a built-in 5x7 bitmap font (``FONT``: digits, ``+``, ``-`` and
``x`` for times), scaled, with per-glyph jitter and Gaussian pixel noise; black on white at a fixed
place (level 0) or, from level 1 on, at a random offset in random ink and background colours. The reference solution first transcribes the
image, then computes: ``'23+45=68 #68'``; the verifier reads the answer after the last ``#``, as
the text arithmetic task does. Images are a pure function of ``(difficulty, seed, index)``.

Train/eval split: by a hash of the expression the image shows (``is_eval_prompt`` of
``meta['expression']``; the prompt text is the same for every problem), so a held-out expression
never appears in training, in any rendering. Held-out sets are drawn per ``data.eval_seed``; a
level's held-out expressions may repeat in a large set, each time drawn anew.

Images are ``height x width`` pixels, multiples of 28, so a Qwen2-VL image processor with
``patch_size=14``, ``merge_size=2`` and ``min_pixels <= height*width`` keeps them as drawn: a
``28 x 84`` image is a ``1 x 2 x 6`` grid of patches, 3 image tokens.
"""
from __future__ import annotations

import dataclasses
import random
import re

import numpy as np

from rljax.data.images import IMAGE_MARKER, Image
from rljax.data.tasks import (MARKER, OPERATORS, Problem, Task, is_eval_prompt,
                              marked_integer_matches, register_task)

# 5 columns x 7 rows per glyph; every glyph spans its columns without a gap, so glyphs are told
# apart by the empty columns between them.
FONT = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("####.", "....#", "....#", ".###.", "....#", "....#", "####."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
    "+": (".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."),
    "-": (".....", ".....", ".....", "#####", ".....", ".....", "....."),
    "x": (".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "....."),
}
GLYPH_ROWS, GLYPH_COLS = 7, 5
_OPS = {"+": "+", "-": "-", "x": "*"}  # drawn symbol -> operator


def glyph(char: str) -> np.ndarray:
  """``[7, 5]`` bool: the font's glyph of ``char``."""
  return np.array([[c == "#" for c in row] for row in FONT[char]], bool)


@dataclasses.dataclass(frozen=True)
class VisualLevel:
  max_operand: int
  ops: str  # drawn symbols of FONT
  height: int  # image size in pixels (multiples of 28)
  width: int
  scale: int  # pixels per font dot
  noise: float  # std of the Gaussian pixel noise (0..255 scale)
  # False: black ink on white, the text one dot in from the left edge and centred vertically;
  # True: random colours of either polarity at a random offset (draw_text).
  random_look: bool = True


def draw_text(text: str, rng: random.Random, level: VisualLevel) -> np.ndarray:
  """``[height, width, 3]`` uint8: ``text`` in the bitmap font, each glyph jittered by up to one
  dot vertically and spaced one or two dots apart, plus Gaussian noise. With
  ``level.random_look``, at a random offset, ink and background in random colours of opposite
  brightness (every channel >= 130 apart); without, black on white at a fixed place (one dot in
  from the left, centred vertically)."""
  s = level.scale
  gaps = [rng.randint(1, 2) * s for _ in text[1:]]
  width = len(text) * GLYPH_COLS * s + sum(gaps)
  jitter = s  # room above and below for the per-glyph shift
  height = GLYPH_ROWS * s + 2 * jitter
  if width > level.width or height > level.height:
    raise ValueError(f"{text!r} does not fit a {level.height}x{level.width} image at scale {s}")
  if level.random_look:
    top = rng.randint(0, level.height - height) + jitter
    x = rng.randint(0, level.width - width)
    light = rng.random() < 0.5
    background = [rng.randint(190, 255) if light else rng.randint(0, 60) for _ in range(3)]
    ink = [rng.randint(0, 60) if light else rng.randint(190, 255) for _ in range(3)]
  else:
    top = (level.height - height) // 2 + jitter
    x = min(s, level.width - width)
    background, ink = [255] * 3, [0] * 3
  mask = np.zeros((level.height, level.width), bool)
  for k, char in enumerate(text):
    y = top + rng.randint(-1, 1) * s
    dots = np.kron(glyph(char), np.ones((s, s), bool))
    mask[y:y + GLYPH_ROWS * s, x:x + GLYPH_COLS * s] |= dots
    x += GLYPH_COLS * s + (gaps[k] if k < len(gaps) else 0)
  pixels = np.where(mask[..., None], np.array(ink, float), np.array(background, float))
  noise = np.random.default_rng(rng.getrandbits(64)).normal(0.0, level.noise, pixels.shape)
  return np.clip(np.rint(pixels + noise), 0, 255).astype(np.uint8)


@register_task
class VisualArithmetic(Task):
  """Read a two-operand expression from an image and evaluate it.

  Image of ``23+45`` with the prompt ``'<image>='`` -> ``'23+45=68 #68'`` (module docstring).
  """

  name = "visual_arithmetic"
  images = True
  split_by_prompt = False  # one prompt text: split by the expression shown
  # Level 0 draws black on white at a fixed place: the only one a fresh tiny policy's cold start
  # learns to read within a CPU budget (docs/results/visual/); 1-3 randomise the look as well.
  levels = {
      0: VisualLevel(19, "+", 28, 84, 2, 8.0, random_look=False),
      1: VisualLevel(19, "+", 28, 84, 2, 8.0),
      2: VisualLevel(99, "+-", 28, 84, 2, 8.0),
      3: VisualLevel(99, "+-x", 28, 84, 2, 12.0),
  }
  _FORMAT = re.compile(r"\d+[-+*]\d+=-?\d+ #-?\d+\s*")

  def _expression(self, rng: random.Random) -> tuple[str, int]:
    lv = self.level
    a, b = rng.randint(0, lv.max_operand), rng.randint(0, lv.max_operand)
    op = rng.choice(lv.ops)
    return f"{a}{op}{b}", OPERATORS[_OPS[op]](a, b)

  def _problem(self, expression: str, value: int, rng: random.Random) -> Problem:
    image = Image.from_array(draw_text(expression, rng, self.level))
    written = "".join(_OPS.get(c, c) for c in expression)
    return Problem(prompt=f"{IMAGE_MARKER}=", answer=str(value),
                   solution=f"{written}={value} {MARKER}{value}",
                   meta=self._meta(expression=expression), images=(image,))

  def sample(self, rng: random.Random) -> Problem:
    expression, value = self._expression(rng)
    return self._problem(expression, value, rng)

  def problem_at(self, seed: int, index: int) -> Problem:
    rng = self._rng("train", seed, index)
    while True:
      expression, value = self._expression(rng)
      if not is_eval_prompt(expression):
        return self._problem(expression, value, rng)

  def eval_set(self, seed: int, n: int) -> list[Problem]:
    rng = self._rng("eval", seed)
    problems = []
    while len(problems) < n:
      expression, value = self._expression(rng)
      if is_eval_prompt(expression):
        problems.append(self._problem(expression, value, rng))
    return problems

  def verify(self, completion: str, problem: Problem) -> float:
    return marked_integer_matches(completion, problem)

  def format_ok(self, completion: str) -> bool:
    return self._FORMAT.fullmatch(completion) is not None

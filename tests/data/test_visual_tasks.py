"""The embedded visual task: what each image shows is its problem (read back from the pixels),
images are fixed by the seed, held-out expressions never appear in training.

(Determinism per seed, reference solutions and perturbed answers are checked for every embedded
task, this one included, by test_embedded_tasks.py.)"""
import itertools

import numpy as np
import pytest

from rljax.data import is_eval_prompt, make_task
from rljax.data.visual_tasks import FONT, glyph

LEVELS = sorted(make_task("visual_arithmetic", 0).levels)


def _column_runs(flags):
  runs, start = [], None
  for i, on in enumerate(list(flags) + [False]):
    if on and start is None:
      start = i
    elif not on and start is not None:
      runs.append((start, i))
      start = None
  return runs


def _cropped(bits):
  rows, cols = np.flatnonzero(bits.any(1)), np.flatnonzero(bits.any(0))
  return bits[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


def read_back(pixels, scale):
  """The text an image shows, read from its pixels alone: ink is what differs from the median
  (background) brightness by over half the task's minimum contrast; glyphs are the runs of columns
  with ink, each sampled one pixel per font dot and matched to the one template it equals."""
  grey = pixels.astype(np.float64).mean(-1)
  ink = np.abs(grey - np.median(grey)) > 65
  text = ""
  for start, stop in _column_runs(ink.any(0)):
    dots = _cropped(ink[:, start:stop])[::scale, ::scale]
    matches = [c for c in FONT if np.array_equal(_cropped(glyph(c)), dots)]
    assert len(matches) == 1, (text, dots.astype(int))
    text += matches[0]
  return text


def test_the_font_tells_every_glyph_apart():
  shapes = [_cropped(glyph(c)) for c in FONT]
  assert all(not np.array_equal(a, b) for a, b in itertools.combinations(shapes, 2))
  assert all(g.any(0).all() for g in shapes)  # no empty column inside a glyph


@pytest.mark.parametrize("level", LEVELS)
def test_each_image_shows_its_problem(level):
  task = make_task("visual_arithmetic", level)
  problems = list(itertools.islice(task.train_stream(seed=0), 40)) + task.eval_set(seed=1, n=10)
  for p in problems:
    (image,) = p.images
    assert (image.height, image.width) == (task.level.height, task.level.width)
    text = read_back(image.pixels, task.level.scale)
    assert text == p.meta["expression"]
    a, op, b = next((text.partition(o) for o in "+-x" if o in text[1:]))
    assert int(p.answer) == {"+": int(a) + int(b), "-": int(a) - int(b),
                             "x": int(a) * int(b)}[op]
    assert task.verify(p.solution, p) == 1.0


def test_images_are_noisy_and_fixed_by_the_seed():
  task = make_task("visual_arithmetic", 2)
  first = [p.images[0].pixels for p in itertools.islice(task.train_stream(seed=5), 8)]
  again = [p.images[0].pixels for p in itertools.islice(task.train_stream(seed=5), 8)]
  other = [p.images[0].pixels for p in itertools.islice(task.train_stream(seed=6), 8)]
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not any(np.array_equal(a, b) for a, b in zip(first, other))
  assert all(len(np.unique(a)) > 20 for a in first)  # noise, not two flat colours


def test_held_out_expressions_never_appear_in_training():
  task = make_task("visual_arithmetic", 2)
  held = {p.meta["expression"] for p in task.eval_set(seed=1, n=64)}
  train = {p.meta["expression"] for p in itertools.islice(task.train_stream(seed=0), 1500)}
  assert all(is_eval_prompt(e) for e in held) and len(held) > 32
  assert not held & train
  assert not any(is_eval_prompt(e) for e in train)


def _looks(level, n=24):
  """(background grey, ink grey, left edge of the first glyph) of ``n`` training images of
  ``level`` (the first ink column less the glyph's own empty columns: '1' starts a dot in)."""
  task = make_task("visual_arithmetic", level)
  out = []
  for p in itertools.islice(task.train_stream(seed=0), n):
    grey = p.images[0].pixels.astype(np.float64).mean(-1)
    ink = np.abs(grey - np.median(grey)) > 65
    margin = np.flatnonzero(glyph(p.meta["expression"][0]).any(0))[0] * task.level.scale
    out.append((np.median(grey), grey[ink].mean(), np.flatnonzero(ink.any(0))[0] - margin))
  return np.array(out)


def test_level_0_is_black_on_white_at_a_fixed_place_and_level_1_is_not():
  plain, varied = _looks(0), _looks(1)
  scale = make_task("visual_arithmetic", 0).level.scale
  assert (plain[:, 0] > 245).all() and (plain[:, 1] < 10).all()  # white, black (noise std 8)
  assert (plain[:, 2] == scale).all()  # one dot in from the left edge
  assert (varied[:, 0] < 128).any() and (varied[:, 0] > 128).any()  # both polarities
  assert len(np.unique(varied[:, 2])) > 5  # random offsets

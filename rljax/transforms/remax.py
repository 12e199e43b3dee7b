"""ReMax's greedy baseline (docs/algorithms.md; Li et al., arXiv 2310.10505): one extra greedy
completion per prompt, scored by the reward function and the section 1 shaping like the others,
then dropped; its reward is the baseline of the prompt's rows (``rljax.algos.remax``)."""
import dataclasses
import time

import numpy as np

from rljax.algos import remax
from rljax.transforms.base import Transform, register_transform


@register_transform("remax", order=60, reads=())
def make(algo, hparams):
  """ReMax's greedy baseline (Li et al., arXiv 2310.10505), with ``algo.advantage='remax'``: one
  extra greedy completion per prompt, same ``max_new_tokens``, scored by ``reward.fn`` and the
  section 1 shaping (no KL), then dropped; its reward ``b_g`` is the baseline of the prompt's
  rows. Logs ``remax/baseline_mean``, ``/adv_mean``, ``/beat_frac`` and ``sec_remax``."""
  if algo["advantage"] != "remax":
    return None

  def on_rollout(host):
    """The greedy completion's reward per row ``[P*G]`` (repeated over the prompt's rows),
    timed apart from the sampled rollout."""
    t0 = time.perf_counter()
    greedy = host.sample(host.problems, host.key, dataclasses.replace(host.sampling, greedy=True),
                         1)
    baseline = np.repeat(np.asarray(greedy.rewards, np.float32), host.group_size)
    rollout = host.rollout.replace(extras={**host.rollout.extras, "remax_baseline": baseline})
    return rollout, {"remax/generated_tokens": float(greedy.lengths.sum()),
                     "sec_remax": time.perf_counter() - t0}

  def advantage_inputs(rollout, group_size):  # one baseline per prompt: its first row's
    return {"remax_baseline": rollout.extras["remax_baseline"][::group_size]}

  def on_score(view):
    g = view.group_size
    return {}, remax.remax_metrics(view.rollout.rewards, view.advantages, view.mask, g,
                                   view.rollout.extras["remax_baseline"][::g])

  return Transform("remax", on_rollout=on_rollout, advantage_inputs=advantage_inputs,
                   on_score=on_score)

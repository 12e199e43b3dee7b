"""Pass@k training's host check and metrics (docs/algorithms.md): the estimator is registered in
``rljax.algos.passk``; it is defined for binary rewards, so other rewards stop the run on the host
before anything is trained on them."""
import numpy as np

from rljax.algos import passk
from rljax.transforms.base import Transform, register_transform


def check_binary_rewards(rewards: np.ndarray) -> None:
  bad = ~np.isin(rewards, (0.0, 1.0))
  if bad.any():
    raise ValueError(f"algo.advantage='passk' needs binary rewards in {{0, 1}}; reward.fn gave "
                     f"{np.unique(np.asarray(rewards)[bad])[:5].tolist()} (shaping such as "
                     "reward.overlong_buffer or reward.format_weight also makes them non-binary)")


@register_transform("passk", order=50, reads=("passk_k",))
def make(algo, hparams):
  """With ``algo.advantage='passk'`` (Chen et al., arXiv 2508.10751): requires
  ``algo.passk_k``, stops the run on the host at the first non-binary reward (the estimator is
  defined for 0/1 rewards), and logs ``passk/estimate``, ``/adv_pos_mean``, ``/adv_neg_mean``,
  ``/zero_frac``."""
  if algo["advantage"] != "passk":
    return None
  k = algo["passk_k"]
  if k is None:
    raise ValueError("algo.advantage='passk' needs algo.passk_k (an integer in [1, "
                     "rollout.group_size]); it has no default")

  def on_rollout(host):
    check_binary_rewards(host.rollout.rewards)
    return host.rollout, {}

  def on_score(view):
    return {}, passk.passk_metrics(view.rollout.rewards, view.mask, view.group_size, k=k)

  return Transform("passk", keys=("passk_k",), on_rollout=on_rollout, on_score=on_score)

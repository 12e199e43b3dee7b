"""VC-PPO / VAPO ladder (arXiv 2503.01491, 2504.05118): PPO -> + value pretraining -> + decoupled
GAE -> + length-adaptive GAE -> + clip-higher and token-level loss -> + positive-example LM loss.

  python -m rljax sweep experiments/studies/vapo_ladder.py

Base: configs/studies/arith_l1_ppo.py (critic, GAE lam 0.95, whitened advantages, k1 KL in the
reward). Scaled to the study task: 20 value-pretraining steps (VC-PPO: 50 on long answers); the
length-adaptive lambda ``1 - 1/(alpha * l)`` uses alpha = 0.2 instead of VAPO's 0.05, since
VAPO's value is for answers of thousands of tokens (here 18-33 tokens, where 0.05 would give
lambda < 0.4; 0.2 gives 0.72-0.85). VAPO's claim: each rung adds accuracy, value pretraining and
decoupled GAE most.
"""
from rljax.sweep.study import Study, ladder


def get_study():
  return Study(
      name="vapo_ladder",
      config="configs/studies/arith_l1_ppo.py",
      variants=ladder([
          ("ppo", {}),
          ("+value_pretrain", {"critic.pretrain_steps": 20}),
          ("+decoupled_gae", {"algo.lam_critic": 1.0}),
          ("+adaptive_gae", {"algo.lam_alpha": 0.2}),
          ("+clip_higher_token_loss", {"algo.clip_eps_high": 0.28, "algo.loss_agg": "token_mean"}),
          ("+pos_lm", {"algo.pos_lm_coef": 0.1}),
      ]),
      seeds=(0, 1, 2),
      metrics=("final_accuracy", "gain_accuracy", "auc_accuracy", "best_accuracy", "final_entropy",
               "final_len_mean", "wall_time_s"),
      baseline="ppo",
      description="VC-PPO / VAPO ladder: does each rung add held-out accuracy over PPO?")

"""On-policy distillation (docs/algorithms.md; Agarwal et al. arXiv 2306.13649, Tinker): minus the
reverse KL to a frozen teacher added to the advantages (``rljax.algos.distill``). The teacher is
a second model that is never trained or checkpointed: ``teacher.source``, same tokenizer, read by
``rljax.loading`` (role ``teacher``)."""
from rljax.algos import distill
from rljax.transforms.base import Transform, register_transform, traced


def check_teacher_logp(metrics, step: int) -> None:
  """Stop when the teacher gave a non-finite log-prob to a sampled token: its advantages would be
  NaN, and every update would be skipped without saying why."""
  bad = metrics.get("opd/teacher_nonfinite", 0.0)
  if bad > 0:
    raise FloatingPointError(
        f"step {step}: the teacher's log-prob is NaN or infinite on {bad:.2%} of the sampled "
        "tokens (check teacher.source and teacher.dtype: the vocabulary, the weights, a float16 "
        "overflow)")


@register_transform("opd", order=40, reads=(
    "opd_coef", "opd_discount", "opd_length_norm", "opd_student_logp"))
def make(algo, hparams):
  """On-policy distillation (Thinking Machines / Tinker 2025; MiniLLM, arXiv 2306.08543), with
  ``algo.opd_coef > 0``: a frozen teacher (``teacher.source``, same tokenizer) scores every
  sampled token and ``A <- A_env + A_opd``, ``A_opd = -coef rkl`` (discounted with
  ``algo.opd_discount``), ``rkl = m (lp_s - teacher_logp)`` detached; ``lp_s`` is ``old_logp`` or
  ``sampler_logp`` (``algo.opd_student_logp``). Stops the run on a non-finite teacher log-prob."""
  if not algo["opd_coef"] > 0:
    return None
  keys = ("opd_student_logp",) + traced(hparams, algo, "opd_coef", "opd_discount")
  if algo["opd_discount"] > 0:  # the normaliser divides the discounted sum (per token: none)
    keys += ("opd_length_norm",)
  length_norm, student = bool(algo["opd_length_norm"]), algo["opd_student_logp"]

  def on_score(view):
    teacher_logp = view.aux_logp("opd")
    student_logp = view.old_logp if student == "old" else view.rollout.sampler_logp
    advantages, metrics = distill.add_opd_advantages(
        view.advantages, student_logp, teacher_logp, view.loss_mask, coef=view.hp["opd_coef"],
        discount=view.hp["opd_discount"], length_norm=length_norm)
    return {"advantages": advantages, "extras": {"teacher_logp": teacher_logp}}, metrics

  return Transform("opd", keys=keys, needs_old_logp=True, on_score=on_score,
                   check_step=check_teacher_logp, aux_role="teacher")

"""On-policy distillation (docs/algorithms.md; Agarwal et al. arXiv 2306.13649, Tinker): minus the
reverse KL to a frozen teacher added to the advantages (``rljax.algos.distill``). The teacher is
a second model that is never trained or checkpointed: ``teacher.source``, same tokenizer."""
import os

from rljax import models
from rljax.models.config import compute_dtype
from rljax.models.source import parse_source
from rljax.algos import distill
from rljax.errors import ModelFileError, StartupError
from rljax.transforms.base import Transform, register_transform, traced
from rljax.models import transformer


TEACHER_SOURCES = ("tiny", "sft", "hf", "run")  # kinds of rljax.models.source


def teacher_path(teacher_section, sft_out_dir: str):
  """The Hugging Face directory of ``teacher.source`` (None for 'tiny': random, for tests); a
  run directory's teacher is its export ``DIR/hf``."""
  source = parse_source(teacher_section.source, "teacher.source", TEACHER_SOURCES)
  if source.step is not None:
    raise StartupError(f"teacher.source={source.text!r}: a teacher is read from the run's Hugging "
                       f"Face export ('run:{source.path}' = {source.hf_dir(sft_out_dir)}), not "
                       "from a checkpoint step")
  return source.hf_dir(sft_out_dir)


def load_teacher(config, tokenizer, policy_cfg):
  """``(ModelConfig, params)`` of the teacher; it must share the policy's tokenizer."""
  if not config.teacher.source:
    raise StartupError("algo.opd_coef > 0 needs a teacher: set teacher.source ('hf:PATH', "
                       "'run:DIR', 'sft' or 'tiny')")
  dtype = config.teacher.dtype or compute_dtype(config.model.dtype)
  path = teacher_path(config.teacher, config.sft.out_dir)
  if path is None:
    cfg = policy_cfg.replace(dtype=dtype)
    return cfg, transformer.init_params(cfg, seed=config.seed + 1)
  if not os.path.isdir(path):
    raise ModelFileError(f"teacher.source={config.teacher.source!r}: {path} is not a directory")
  cfg, params = models.load_hf(path, dtype=dtype, param_dtype=config.model.param_dtype)
  same = (cfg.vocab_size == policy_cfg.vocab_size and cfg.eos_token_id == policy_cfg.eos_token_id
          and cfg.pad_token_id == policy_cfg.pad_token_id)
  if not same:
    raise StartupError(
        f"teacher.source={config.teacher.source!r} has another tokenizer than the policy "
        f"(vocab {cfg.vocab_size} / eos {cfg.eos_token_id} / pad {cfg.pad_token_id} vs "
        f"{policy_cfg.vocab_size} / {policy_cfg.eos_token_id} / {policy_cfg.pad_token_id}): "
        "on-policy distillation scores the student's tokens, so both must share one")
  return cfg, params


def check_teacher_files(config):
  """The teacher's directory, checked from its header before the run dir is claimed ('sft' may
  be trained first, 'tiny' has none)."""
  if not config.teacher.source:
    raise StartupError("algo.opd_coef > 0 needs a teacher: set teacher.source ('hf:PATH', "
                       "'run:DIR', 'sft' or 'tiny')")
  path = teacher_path(config.teacher, config.sft.out_dir)
  if path is None or config.teacher.source == "sft":
    return ()
  return (("teacher.source", config.teacher.source, path),)


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
                   check_step=check_teacher_logp, aux_model=load_teacher,
                   check_aux=check_teacher_files)

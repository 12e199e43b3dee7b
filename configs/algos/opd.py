"""On-policy distillation (Thinking Machines 2025; MiniLLM arXiv 2306.08543): the student samples,
a teacher scores every sampled token, and ``-opd_coef x`` the per-token reverse KL is added to
the GRPO advantage (Tinker's defaults: coefficient 1, no discount; docs/algorithms.md).

The teacher is the main job's exported policy (``runs/main/hf``); point ``teacher.source`` at
another one with ``--config.teacher.source=hf:PATH``. It must share the student's tokenizer. The
teacher is the anchor, so there is no KL to a reference.
"""
from rljax.config.loader import based_on


def get_config():
  c = based_on("algos/grpo.py")
  c.algo.opd_coef = 1.0
  c.algo.opd_discount = 0.0
  c.algo.opd_student_logp = "old"
  c.algo.kl_placement = "none"
  c.teacher.source = "run:runs/main"
  return c

"""On-policy distillation advantage (ALGORITHMS.md 8.6) vs the sheet's NumPy."""
import jax
import numpy as np
import pytest

from rljax.algos import distill

from .helpers import jit, prefix_mask

B, T = 6, 5


# --- the sheet's NumPy references (float64) ------------------------------------------------------

def opd_advantage(student_logp, teacher_logp, m, coef=1.0, gamma=0.0, length_norm=False):
    a = -coef * (student_logp - teacher_logp) * m
    if gamma == 0.0: return a
    out = np.zeros_like(a); L = np.zeros_like(a); acc = np.zeros(a.shape[0]); n = np.zeros(a.shape[0])
    for t in reversed(range(a.shape[1])):
        acc = a[:, t] + gamma * acc; n = m[:, t] + gamma * n; out[:, t], L[:, t] = acc, n
    return (np.where(m > 0, out / np.maximum(L, 1e-12), 0.0) if length_norm else out) * m


def make_logps(seed, holes=False):
  rng = np.random.default_rng(seed)
  m = prefix_mask(rng, B, T, np.float64)
  if holes:
    m[3] = [1, 0, 1, 1, 0]  # a mask with holes
  student = -rng.uniform(0.01, 5.0, size=(B, T))
  teacher = student + rng.normal(scale=0.7, size=(B, T))
  teacher[m == 0] = -np.inf  # padding is never read
  return student, teacher, m


opd_fn = jit(distill.opd_advantages, static_argnames=("coef", "discount", "length_norm"))


@pytest.mark.parametrize("coef, gamma, norm", [(1.0, 0.0, False), (0.5, 0.0, True),
                                               (1.0, 0.9, False), (2.0, 0.9, True),
                                               (1.0, 1.0, True)])
def test_opd_matches_reference(x64, coef, gamma, norm):
  student, teacher, m = make_logps(int(gamma * 10) + int(norm), holes=True)
  adv, metrics = opd_fn(student, teacher, m, coef=coef, discount=gamma, length_norm=norm)
  finite_teacher = np.where(m > 0, teacher, 0.0)
  want = opd_advantage(student, finite_teacher, m, coef, gamma, norm)
  np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-6, atol=1e-12)
  v = m > 0
  np.testing.assert_allclose(float(metrics["opd/reverse_kl"][0]),
                             (student - finite_teacher)[v].sum(), rtol=1e-9)
  np.testing.assert_allclose(float(metrics["opd/adv_mean"][0]), want[v].sum(), rtol=1e-9,
                             atol=1e-12)
  assert float(metrics["opd/adv_mean"][1]) == v.sum()


def test_opd_coef_zero_is_identity_and_teacher_equal_student_is_zero(x64):
  student, teacher, m = make_logps(20)
  env = np.random.default_rng(20).normal(size=(B, T)) * m
  for gamma, norm in ((0.0, False), (0.9, True)):
    total, metrics = distill.add_opd_advantages(env, student, teacher, m, coef=0.0,
                                                discount=gamma, length_norm=norm)
    np.testing.assert_array_equal(np.asarray(total), env)
    np.testing.assert_allclose(float(metrics["opd/env_adv_abs_mean"][0]), np.abs(env).sum())
    adv, _ = distill.opd_advantages(student, np.where(m > 0, student, -np.inf), m, coef=1.5,
                                    discount=gamma, length_norm=norm)
    np.testing.assert_array_equal(np.asarray(adv), np.zeros_like(m))


def test_opd_adds_to_env_advantages_without_gradient(x64):
  student, teacher, m = make_logps(21)
  env = np.random.default_rng(21).normal(size=(B, T)) * m
  total, _ = distill.add_opd_advantages(env, student, teacher, m, coef=0.3)
  np.testing.assert_allclose(np.asarray(total), env + opd_advantage(
      student, np.where(m > 0, teacher, 0), m, 0.3), rtol=1e-12)
  grad = jax.grad(lambda s: distill.opd_advantages(s, teacher, m, coef=1.0)[0].sum())(student)
  assert not np.asarray(grad).any()  # the reward is detached


def test_opd_bad_discount_names_the_key():
  ones = np.ones((2, 2))
  with pytest.raises(ValueError, match="algo.opd_discount"):
    distill.opd_advantages(ones, ones, ones, coef=1.0, discount=1.5)


def test_opd_counts_nonfinite_teacher_logp_on_valid_tokens_only(x64):
  student, teacher, m = make_logps(22)  # padding already holds -inf
  _, metrics = distill.opd_advantages(student, teacher, m, coef=1.0)
  assert float(metrics["opd/teacher_nonfinite"][0]) == 0.0
  first_valid = tuple(np.argwhere(m > 0)[0])
  teacher[first_valid] = np.nan
  teacher[tuple(np.argwhere(m > 0)[1])] = -np.inf
  total, count = distill.opd_advantages(student, teacher, m, coef=1.0)[1]["opd/teacher_nonfinite"]
  assert (float(total), float(count)) == (2.0, m.sum())

"""Section 8 components accept traced float hyperparameters (``rljax.algorithm.resolve`` passes every
float key as an entry of a float32 ``hparams`` tree, so a sweep reuses one compilation): the
results equal the call with the same values as Python numbers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos import correction, cov, distill, entropy, sapo

from .helpers import jit, log_ratios, prefix_mask

B, T = 6, 5


def _inputs():
  rng = np.random.default_rng(0)
  m = prefix_mask(rng, B, T, np.float64)
  old = -rng.uniform(0.01, 5.0, size=(B, T))
  logp = old + log_ratios(rng, (B, T))
  sampler = old - rng.normal(scale=0.4, size=(B, T))
  adv = np.repeat(rng.normal(scale=1.5, size=(B, 1)), T, 1) * m
  H = rng.gamma(2.0, 0.5, size=(B, T))
  u = rng.random((B, T))
  return dict(logp=logp, old=old, sampler=sampler, adv=adv, m=m, H=H, u=u)


def _f32(**hp):
  """The hyperparameters as the float32 values the traced path sees, as Python floats."""
  return {k: float(np.float32(v)) for k, v in hp.items()}


CASES = {
    "sapo": (lambda x, **hp: sapo.sapo_loss(x["logp"], x["old"], x["adv"], x["m"], **hp)[0],
             dict(tau_pos=1.0, tau_neg=1.05)),
    "sapo_sequence": (lambda x, **hp: sapo.sapo_sequence_loss(x["logp"], x["old"], x["adv"],
                                                              x["m"], **hp)[0],
                      dict(tau_pos=0.7, tau_neg=2.0)),
    "clip_cov_select": (lambda x, **hp: cov.clip_cov_select(x["old"], x["adv"], x["m"], x["u"],
                                                            **hp)[0],
                        dict(ratio=0.2, lb=0.1, ub=5.0)),
    "clip_cov_loss": (lambda x, **hp: cov.clip_cov_loss(x["logp"], x["old"], x["adv"], x["m"],
                                                        x["u"] < 0.3, **hp)[0],
                      dict(eps_low=0.2, eps_high=0.28)),
    "kl_cov_select": (lambda x, **hp: cov.kl_cov_select(x["old"], x["adv"], x["m"], **hp)[0],
                      dict(ratio=0.1)),
    "kl_cov_loss": (lambda x, **hp: cov.kl_cov_loss(x["logp"], x["old"], x["adv"], x["m"],
                                                    x["u"] < 0.3, **hp)[0], dict(coef=0.7)),
    "entropy_keep": (lambda x, **hp: entropy.entropy_keep_mask(x["H"], x["m"], **hp)[0],
                     dict(rho=0.2)),
    "entropy_keep_off": (lambda x, **hp: entropy.entropy_keep_mask(x["H"], x["m"], **hp)[0],
                         dict(rho=1.5)),
    "entropy_ctrl": (lambda x, **hp: entropy.entropy_ctrl_step(
        entropy.entropy_ctrl_init(0.001), 0.15, **hp), dict(target=0.2, delta=1e-4,
                                                             coef_min=0.0, coef_max=0.005)),
    "rollout_is": (lambda x, **hp: correction.rollout_is_weights(
        x["old"], x["sampler"], x["m"], level="sequence", batch_norm=True, **hp)[0],
                   dict(cap=2.0, floor=0.5)),
    "rollout_rs": (lambda x, **hp: correction.rollout_rejection_mask(
        x["old"], x["sampler"], x["m"], level="token", **hp)[0],
                   dict(lo=0.5, hi=2.0, veto=0.3, k3=0.2)),
    "opd": (lambda x, **hp: distill.opd_advantages(x["old"], x["sampler"], x["m"],
                                                   length_norm=True, **hp)[0],
            dict(coef=0.5, discount=0.9)),
    "opd_no_discount": (lambda x, **hp: distill.opd_advantages(x["old"], x["sampler"], x["m"],
                                                               **hp)[0],
                        dict(coef=0.5, discount=0.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_traced_hyperparameters_match_static(x64, case):
  fn, hp = CASES[case]
  x = _inputs()
  static = fn(x, **_f32(**hp))
  traced = jit(lambda hp: fn(x, **hp))({k: jnp.asarray(v, jnp.float32) for k, v in hp.items()})
  for want, got in zip(jax.tree.leaves(static), jax.tree.leaves(traced)):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-6, atol=1e-12, err_msg=case)

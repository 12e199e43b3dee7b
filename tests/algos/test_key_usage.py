"""No key is silently ignored: every algorithm key, perturbed on every preset, either changes what
the algorithm computes on inputs where it binds, or stops ``resolve`` with an error naming it.

What the algorithm computes (``fingerprint``): the advantages, the transforms' score and
minibatch hooks, the policy loss with every regulariser and its metrics, the critic's loss and
optimizer update, the transforms' per-step state, the reference update, the dynamic-sampling
decision and the update schedule, all on one synthetic batch whose log-ratios, advantages,
covariances, lengths and entropies make each clip, bound and selection bind somewhere. The
verifier-process keys of ``reward.*`` (fn, timeout_s, workers, logging, memory) are read by every
verifier call and tested in tests/reliability; the reward shaping keys are perturbed here.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.config import loader as config_loader
from rljax.algos import value as value_lib
from rljax.algorithm import hparams_tree, resolve
from rljax.config.table import KEYS
from rljax.errors import UnusedKeyError
from rljax.rewards import shaping
from rljax.rollout.record import Rollout
from rljax.data import datasets
from rljax.train import build, filters, selective
from rljax.transforms import Minibatch, Scored
from tests.train import tiny

PRESETS = ["ppo", "grpo", "dr_grpo", "dapo", "gpg", "rloo", "reinforce_pp", "t1", "orz",
           "vc_ppo", "vapo", "gspo", "cispo", "gmpo", "sapo", "clip_cov", "kl_cov", "opd", "remax"]
REWARD_SHAPING = ("reward.overlong_buffer", "reward.overlong_penalty")
PERTURBED = [k for k in KEYS if k.section in ("algo", "critic") or k.name in REWARD_SHAPING]
ROWS, T = 48, 6  # at least 3 groups of the largest preset G (16)


def _candidates(key, d):
  kind = key.check.type
  if key.check.options:
    return [o for o in key.check.options if o != d]
  if key.check.family:
    from rljax.config.declare import registry_names
    return [n for n in registry_names(key.check.family) if n != d]
  if kind is bool:
    return [not d]
  if kind is tuple:
    return [(0.2, 0.8), ("x",)]
  if kind is int:
    return [v for v in ((d or 0) + 2, (d or 0) + 1, 2, 1) if v != d]
  base = 0.0 if d is None else d
  return [v for v in (base * 1.5 + 0.1, 2.0, 0.5, 1.5, 0.05, 3.0, -0.5) if v != d]


def perturbed_value(key, current):
  """A value the key's declaration allows, other than ``current`` (the preset's)."""
  return next(v for v in _candidates(key, current) if key.check(v) is None and v != current)


def _inputs(group_size):
  """One synthetic batch of ``ROWS / G`` groups: mixed rewards, lengths 1..T with truncated rows,
  log-ratios up to ~10x both ways, entropies and values spread so that every bound binds."""
  rng = np.random.default_rng(0)
  b, num_groups = ROWS, ROWS // group_size
  lengths = rng.integers(1, T + 1, b)
  lengths[:2] = T
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  rewards = rng.integers(0, 2, b).astype(np.float32)
  rewards[:group_size] = 1.0  # one all-correct group
  rewards[group_size] = 1.0 - rewards[group_size + 1]  # spread in the second
  rewards[2 * group_size:3 * group_size] = 0.0
  rewards[2 * group_size] = 1.0  # the third: one right answer (pass rate 1/G)
  old = -rng.uniform(0.05, 8.0, (b, T))
  f = lambda x: jnp.asarray(np.where(mask > 0, x, 0.0), jnp.float32)
  return dict(
      mask=jnp.asarray(mask), rewards=jnp.asarray(rewards), lengths=lengths,
      truncated=jnp.asarray(lengths == T), old_logp=f(old),
      logp=f(old + rng.uniform(-2.3, 2.3, (b, T))),
      sampler_logp=f(old + rng.uniform(-1.5, 1.5, (b, T))),
      ref_logp=f(old + rng.normal(0, 0.5, (b, T))),
      teacher_logp=f(old + rng.normal(0, 1.0, (b, T))),
      entropy=f(rng.uniform(0.0, 3.0, (b, T))),
      router_aux=f(np.full((b, T), 1.3)),  # an MoE forward's load-balancing loss on its tokens
      values=f(rng.normal(0, 1.0, (b, T))), new_values=f(rng.normal(0, 1.5, (b, T))),
      remax_baseline=jnp.asarray(np.repeat(rng.uniform(0, 1, num_groups), group_size),
                                 jnp.float32))


def fingerprint(config):
  """Every number the resolved algorithm computes on the synthetic batch, concatenated."""
  algo = resolve(config)
  g = config.rollout.group_size
  x = _inputs(g)
  out = [np.asarray([algo.epochs, algo.minibatches, algo.micro_batches], np.float64)]
  state = {t.name: t.init() for t in algo.transforms if t.init}
  hp = hparams_tree(algo)  # arrays, as the trainer passes them: one compilation per structure
  for t in algo.transforms:
    if t.coefs is not None:
      hp.update(t.coefs(state[t.name]))
  r, max_new = config.reward, config.rollout.max_new_tokens
  lengths = np.linspace(1, max_new, len(x["lengths"])).round()  # the whole budget, for shaping
  rewards = x["rewards"] + shaping.overlong_penalty(
      lengths, max_new_tokens=max_new, overlong_buffer=r.overlong_buffer,
      overlong_penalty=r.overlong_penalty)
  if config.algo.dynamic_sampling:
    keep = filters.group_keep_mask(np.asarray(x["rewards"] > 0), np.asarray(rewards), g,
                                   config.algo.keep_pass_rate)
    out.append(np.append(keep, config.algo.max_gen_batches).astype(np.float64))
  if config.algo.selective_rollout:
    out.append(_selective_fingerprint(config, np.asarray(x["rewards"] > 0)))
  mask, token_rewards = x["mask"], None
  if algo.old_logp == "sampler":  # as rljax.learner.step.score takes them
    x["old_logp"] = x["sampler_logp"]
  if algo.kl_placement == "reward":
    import rljax.algos as algos
    kl = dict(kl_coef=hp["kl_coef"], estimator=algo.kl_estimator)
    token_rewards = algos.kl_reward_tokens(rewards, mask, x["old_logp"], x["ref_logp"], **kl)
    rewards = rewards + algos.kl_reward_penalty(mask, x["old_logp"], x["ref_logp"], **kl).sum(1)
  rollout = Rollout(prompt_tokens=None, prompt_mask=None, tokens=None, mask=mask,
                    sampler_logp=x["sampler_logp"], draw_logp=None, lengths=None,
                    truncated=x["truncated"], rewards=x["rewards"],
                    extras={"remax_baseline": x["remax_baseline"]})
  extra = {}
  for t in algo.transforms:
    if t.advantage_inputs is not None:
      extra.update(t.advantage_inputs(rollout, g))
  adv, returns = algo.advantages(rewards=rewards, mask=mask, values=x["values"],
                                 token_rewards=token_rewards, hp=hp, **extra)
  loss_mask = shaping.overlong_filter_mask(mask, x["truncated"]) if algo.overlong_filter \
      else mask
  view = Scored(rollout=rollout, hp=hp, group_size=g, mask=mask, loss_mask=loss_mask,
                advantages=adv, old_logp=x["old_logp"], entropy=x["entropy"],
                aux_logp=lambda name: x["teacher_logp"])
  metrics = {}
  for t in algo.transforms:
    if t.on_score is not None:
      changes, m = t.on_score(view)
      view, metrics = view.apply(changes), {**metrics, **m}
  batch = view.rollout.replace(loss_mask=view.loss_mask, advantages=view.advantages,
                               old_logp=x["old_logp"], ref_logp=x["ref_logp"], returns=returns,
                               values=x["values"],
                               positive=value_lib.positive_example_rows(x["rewards"]))
  for t in algo.transforms:
    if t.on_minibatch is not None:
      extras, m = t.on_minibatch(Minibatch(batch, hp, seed=0, step=0, index=0))
      batch, metrics = batch.replace(extras={**batch.extras, **extras}), {**metrics, **m}
  arrays = dict(batch.extras, mask=batch.loss_mask, advantages=batch.advantages,
                old_logp=batch.old_logp, sampler_logp=batch.sampler_logp,
                ref_logp=batch.ref_logp, positive=batch.positive, rewards=batch.rewards,
                logp=x["logp"], entropy=x["entropy"], router_aux=x["router_aux"])
  loss_sum, m = algo.policy_loss_sum(hp=hp, **arrays)
  metrics.update(m, policy_loss=(loss_sum, algo.policy_loss_count(batch.loss_mask)))
  for reg in algo.regularizers:
    metrics[reg.name] = (hp[reg.coef] * algo.regularizer_sum(reg, hp, **arrays),
                         reg.count(**arrays))
  for t in algo.transforms:
    if t.on_loss is not None:
      metrics.update(t.on_loss(arrays))
  for t in algo.transforms:
    if t.on_step is not None:
      state[t.name], m = t.on_step(state[t.name], hparams_tree(algo), batch, metrics)
      metrics.update(m)
  if config.critic.enabled:
    critic_sum, m = value_lib.value_loss_sum(x["new_values"], x["values"], returns,
                                             batch.loss_mask, clip=config.critic.value_clip)
    metrics.update(m, critic=(critic_sum, jnp.ones(())))
    critic_tx = build.optimizers(config)[1]
    grad = {"w": jnp.linspace(-1.0, 1.0, 5)}
    update, _ = critic_tx.update(grad, critic_tx.init(grad), grad)
    out += [np.asarray(update["w"]), np.asarray([config.critic.pretrain_steps], np.float64)]
  if algo.kl_placement is not None:
    params = {"w": jnp.linspace(-1.0, 1.0, 5)}
    out.append(np.asarray(algo.ref_update(jax.tree.map(jnp.zeros_like, params), params, hp)["w"]))
  out += [np.asarray(v, np.float64).ravel() for v in jax.tree.leaves((adv, returns, metrics,
                                                                      state, batch.extras))]
  return np.concatenate([o.ravel() for o in out])


def _selective_fingerprint(config, correct):
  """Selective rollouts' numbers: the per-kind targets and exploration probabilities, the skip
  probabilities of runs of 1-3 groups, and a step's adaptation on the synthetic batch's groups."""
  g = config.rollout.group_size
  source = selective.selective_source(
      datasets.PromptSource("embedded:arithmetic", difficulty=0), config)
  problems = source.next_batch(len(correct) // g)
  fixed = [*source.target.values(), *source.explore.values(),
           *(selective.skip_probability(p, z) for p in source.explore.values() for z in (1, 2, 3))]
  source.observe(problems, correct)
  return np.asarray(fixed + list(source.end_step().values()), np.float64)


def _config(preset, key=None, value=None):
  overrides = [] if key is None else [(key.name, value)]
  config = config_loader.load_config(os.path.join(tiny.ROOT, "configs", "algos", f"{preset}.py"))
  config.unlock()
  for name, v in overrides:
    section, leaf = name.split(".")
    config[section][leaf] = v
  return config


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_key_changes_the_algorithm_or_is_refused_by_name(preset):
  base = fingerprint(_config(preset))
  assert np.array_equal(base, fingerprint(_config(preset)))  # deterministic
  outcomes = {"changed": [], "unused": [], "switched": [], "refused": []}
  preset_config = _config(preset)
  for key in PERTURBED:
    section, leaf = key.name.split(".")
    value = perturbed_value(key, preset_config[section][leaf])
    try:
      after = fingerprint(_config(preset, key, value))
    except UnusedKeyError as e:
      if str(e).startswith(f"{key.name}={value!r} is not used"):
        outcomes["unused"].append(key.name)
      else:  # a switch: its new value leaves another of the preset's settings unread
        assert str(e).split("=")[0] != key.name and " is not used" in str(e), str(e)
        outcomes["switched"].append(key.name)
      continue
    except ValueError as e:  # a combination this algorithm cannot run, naming the key
      assert key.name in str(e), (key.name, value, str(e))
      outcomes["refused"].append(key.name)
      continue
    same = after.shape == base.shape and np.array_equal(after, base, equal_nan=True)
    assert not same, f"{preset}: {key.name}={value!r} is accepted and changes nothing"
    outcomes["changed"].append(key.name)
  # Each outcome happens: the inputs bind, and the check is not vacuous.
  assert outcomes["changed"] and outcomes["unused"], outcomes


def test_dual_clip_on_cispo_names_the_objectives_that_read_it():
  config = _config("cispo")
  config.algo.dual_clip_c = 3.0
  with pytest.raises(UnusedKeyError,
                     match=r"algo.dual_clip_c=3.0 is not used by advantage 'grpo', policy_loss "
                           r"'cispo'; it is read by policy_loss 'gspo', policy_loss 'ppo'"):
    resolve(config)


def test_critic_and_shaping_keys_without_their_feature_are_refused():
  config = _config("grpo")
  config.critic.value_clip = 0.3
  with pytest.raises(UnusedKeyError, match=r"critic.value_clip=0.3 is not used: there is no "
                                                  r"critic \(critic.enabled=False\)"):
    resolve(config)
  config = _config("grpo")
  config.reward.overlong_penalty = 2.0
  with pytest.raises(UnusedKeyError, match=r"reward.overlong_penalty=2.0 .*overlong_buffer=0"):
    resolve(config)


def test_every_transform_reads_only_keys_it_declares():
  from rljax.transforms import TRANSFORMS
  for preset in PRESETS:
    for key in PERTURBED:
      section, leaf = key.name.split(".")
      value = perturbed_value(key, _config(preset)[section][leaf])
      try:
        algo = resolve(_config(preset, key, value))
      except ValueError:
        continue
      for t in algo.transforms:
        reads = set(TRANSFORMS.meta(t.name)["reads"])
        assert {f"algo.{k}" for k in t.keys} <= reads, (preset, key.name, t.name)


@pytest.mark.parametrize("name,value", [("skip_target", 0.6), ("skip_explore", 0.2)])
def test_selective_rollout_keys_change_the_algorithm_once_it_is_on(name, value):
  # No preset turns selective rollouts on, so above its keys are only ever "unused"; on, each
  # moves the per-kind targets or exploration probabilities the source steers with.
  on = _config("dapo", next(k for k in KEYS if k.name == "algo.selective_rollout"), True)
  perturbed = _config("dapo", next(k for k in KEYS if k.name == f"algo.{name}"), value)
  perturbed.algo.selective_rollout = True
  assert not np.array_equal(fingerprint(on), fingerprint(perturbed))
